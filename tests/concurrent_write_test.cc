// Eight threads changing one writable Filesystem at once -- namespace and
// data operations in private and shared directories, xattrs, renames, and a
// ninth thread committing now and then -- then the image is compared with
// each thread's own model, through the same view, after a reopen, and by
// btrfs check. ./test runs it under TSan (the Concurrent* filter).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/mkfs_util.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/mkfs.h"
#include "ubtrfs/stats.h"

namespace UBTRFS_UNITY_ID {

namespace stdfs = std::filesystem;
using ubtrfs::Filesystem;
using ubtrfs::InodeId;
using ubtrfs::NewInode;

struct FileModel {
  std::string data;
  std::map<std::string, std::string> xattrs;
};

// What one thread believes it made: paths relative to the root.
struct ThreadModel {
  std::map<std::string, FileModel> files;
  std::vector<std::string> dirs;
};

std::string Bytes(std::mt19937& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

// Splits "a/b" into the parent's id and the leaf name.
std::pair<InodeId, std::string> Parent(Filesystem& fs, const std::string& rel) {
  const auto slash = rel.rfind('/');
  auto dir = fs.Lookup("/" + rel.substr(0, slash));
  EXPECT_TRUE(dir.ok()) << rel << ": " << dir.status().ToString();
  return {dir.ok() ? *dir : InodeId{}, rel.substr(slash + 1)};
}

void Worker(Filesystem& fs, int t, int ops, ThreadModel* m, std::atomic<int>* failures) {
  std::mt19937 rng(static_cast<unsigned>(1000 + t));
  const std::string own = "t" + std::to_string(t);
  auto fail = [&](const std::string& what, const ubtrfs::Status& st) {
    ADD_FAILURE() << "thread " << t << ": " << what << ": " << st.ToString();
    failures->fetch_add(1);
  };
  {
    auto d = fs.Mkdir(fs.Root(), own, NewInode{.mode = 0755});
    if (!d.ok()) return fail("mkdir " + own, d.status());
    m->dirs.push_back(own);
  }
  int serial = 0;
  for (int i = 0; i < ops && failures->load() == 0; ++i) {
    const int op = static_cast<int>(rng() % 100);
    // Private directory or the shared one (names carry the thread's prefix,
    // so threads never touch each other's entries but do share the directory
    // and its leaves).
    const std::string dir = rng() % 3 == 0 ? std::string("shared") : own;
    if (op < 35 || m->files.empty()) {  // create + write
      const std::string rel = dir + "/" + own + "-f" + std::to_string(serial++);
      auto [pid, name] = Parent(fs, rel);
      auto f = fs.Create(pid, name, NewInode{.mode = 0644});
      if (!f.ok()) return fail("create " + rel, f.status());
      const std::string data = Bytes(rng, rng() % 3 == 0 ? rng() % 9000 : rng() % 600);
      auto n = fs.Write(*f, 0, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
      if (!n.ok()) return fail("write " + rel, n.status());
      m->files[rel].data = data;
      continue;
    }
    auto it = m->files.begin();
    std::advance(it, rng() % m->files.size());
    const std::string rel = it->first;
    auto id = fs.Lookup("/" + rel);
    if (!id.ok()) return fail("lookup " + rel, id.status());
    if (op < 50) {  // append
      const std::string more = Bytes(rng, rng() % 5000);
      auto n = fs.Write(*id, it->second.data.size(), std::span(reinterpret_cast<const uint8_t*>(more.data()), more.size()));
      if (!n.ok()) return fail("append " + rel, n.status());
      it->second.data += more;
    } else if (op < 60) {  // truncate
      const uint64_t size = it->second.data.empty() ? 0 : rng() % it->second.data.size();
      ubtrfs::AttrChange c;
      c.size = size;
      if (auto st = fs.SetAttr(*id, c); !st.ok()) return fail("truncate " + rel, st);
      it->second.data.resize(size);
    } else if (op < 70) {  // xattr
      const std::string name = "user.k" + std::to_string(rng() % 3), value = Bytes(rng, rng() % 40);
      if (auto st = fs.SetXattr(*id, name, value); !st.ok()) return fail("setxattr " + rel, st);
      it->second.xattrs[name] = value;
    } else if (op < 85) {  // rename between the thread's own dir and shared
      const std::string to_dir = rel.rfind("shared/", 0) == 0 ? own : std::string("shared");
      const std::string to = to_dir + "/" + own + "-r" + std::to_string(serial++);
      auto [from_id, from_name] = Parent(fs, rel);
      auto [to_id, to_name] = Parent(fs, to);
      if (auto st = fs.Rename(from_id, from_name, to_id, to_name); !st.ok()) return fail("rename " + rel, st);
      FileModel fm = std::move(it->second);
      m->files.erase(it);
      m->files[to] = std::move(fm);
    } else {  // unlink
      auto [pid, name] = Parent(fs, rel);
      if (auto st = fs.Unlink(pid, name); !st.ok()) return fail("unlink " + rel, st);
      m->files.erase(it);
    }
  }
}

void Compare(Filesystem& fs, const std::vector<ThreadModel>& models, const char* when) {
  size_t expected_shared = 0;
  for (const auto& m : models) {
    for (const auto& [rel, fm] : m.files) {
      if (rel.rfind("shared/", 0) == 0) ++expected_shared;
      auto id = fs.Lookup("/" + rel);
      ASSERT_TRUE(id.ok()) << when << ": " << rel << ": " << id.status().ToString();
      auto st = fs.GetStat(*id);
      ASSERT_TRUE(st.ok());
      ASSERT_EQ(st->size, fm.data.size()) << when << ": " << rel;
      std::string got(fm.data.size(), '\0');
      auto n = fs.Read(*id, 0, std::span(reinterpret_cast<uint8_t*>(got.data()), got.size()));
      ASSERT_TRUE(n.ok());
      ASSERT_EQ(got, fm.data) << when << ": " << rel;
      for (const auto& [k, v] : fm.xattrs) {
        auto x = fs.GetXattr(*id, k);
        ASSERT_TRUE(x.ok()) << when << ": " << rel << " " << k;
        EXPECT_EQ(*x, v);
      }
    }
    // Nothing more than the model in the thread's own directory.
    auto own = fs.Lookup("/" + m.dirs.at(0));
    ASSERT_TRUE(own.ok());
    auto entries = fs.ReadDir(*own);
    ASSERT_TRUE(entries.ok());
    size_t want = 0;
    for (const auto& [rel, fm] : m.files) want += rel.rfind(m.dirs[0] + "/", 0) == 0;
    EXPECT_EQ(entries->size(), want) << when << ": " << m.dirs[0];
  }
  auto shared = fs.Lookup("/shared");
  ASSERT_TRUE(shared.ok());
  auto entries = fs.ReadDir(*shared);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), expected_shared) << when;
}

// A scratch directory with a fresh 256 MiB image in it.
struct ScratchImage {
  stdfs::path dir;
  std::string img;
};
void MakeScratchImage(const char* name, ScratchImage* out) {
  std::string tmpl = std::string("/tmp/ubtrfs-") + name + ".XXXXXX";
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  out->dir = tmpl;
  out->img = (out->dir / "img").string();
  ubtrfs::MkfsSpec spec;  // (the library's, so the TSan tree needs no ubtrfs command)
  spec.images = {out->img};
  spec.size = 256ull << 20;
  ubtrfs::Status st = ubtrfs::Mkfs(spec);
  ASSERT_TRUE(st.ok()) << st.ToString();
}

// tiny_cache: a node cache of four blocks, so the threads' reads miss it and
// meet the blocks a commit has sealed but is still writing in its second
// half (the committer's Commit() lets the workers go on meanwhile).
void RunEightThreads(bool queue_dir_items, bool tiny_cache = false) {
  ScratchImage scratch;
  ASSERT_NO_FATAL_FAILURE(MakeScratchImage("cwrite", &scratch));
  const stdfs::path& dir = scratch.dir;
  const std::string& img = scratch.img;

  constexpr int kThreads = 8;
  const int ops = std::getenv("UBTRFS_SOAK") ? 4000 : 300;
  std::vector<ThreadModel> models(kThreads);
  {
    ubtrfs::OpenOptions oo{.writable = true};
    if (queue_dir_items) {  // every directory's DIR_ITEMs through the name-hash index and its queue
      oo.dir_item_index_after = 1;
      oo.dir_item_batch = 8;
    }
    if (tiny_cache) oo.node_cache_bytes = 64 << 10;
    ubtrfs::ResetStats();
    auto fs = Filesystem::Open(img, oo);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    ASSERT_TRUE((*fs)->Mkdir((*fs)->Root(), "shared", NewInode{.mode = 0777}).ok());
    std::atomic<int> failures{0};
    std::atomic<bool> done{false};
    std::thread committer([&] {
      // Commits while the others work: each waits for operations in flight.
      while (!done.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(15));
        if (auto st = (*fs)->Commit(); !st.ok()) {
          ADD_FAILURE() << "commit: " << st.ToString();
          failures.fetch_add(1);
          return;
        }
      }
    });
    std::vector<std::thread> workers;
    for (int t = 0; t < kThreads; ++t) workers.emplace_back(Worker, std::ref(**fs), t, ops, &models[t], &failures);
    for (auto& w : workers) w.join();
    done = true;
    committer.join();
    ASSERT_EQ(failures.load(), 0);
    Compare(**fs, models, "before the last commit");
    ASSERT_TRUE((*fs)->Commit().ok());
    EXPECT_GT(ubtrfs::CollectStats().Counter("commit.count"), 1u);
    if (queue_dir_items) {
      EXPECT_GT(ubtrfs::CollectStats().Counter("dir_items.queued"), 100u);
    }
    if (tiny_cache) {
      EXPECT_GT(ubtrfs::CollectStats().Counter("tree.unwritten_block_reads"), 0u);
    }
  }
  {
    auto fs = Filesystem::Open(img);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    Compare(**fs, models, "after reopening");
  }
  EXPECT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  std::error_code ec;
  stdfs::remove_all(dir, ec);
}

TEST(ConcurrentWrite, EightThreadsOneTransactionMatchTheirModels) { RunEightThreads(false); }
TEST(ConcurrentWrite, EightThreadsReadBlocksACommitIsStillWriting) { RunEightThreads(false, true); }
TEST(ConcurrentWrite, EightThreadsQueuedDirItemsMatchTheirModels) { RunEightThreads(true); }

}  // namespace

namespace UBTRFS_UNITY_ID {

// Creators that never pause (a new shared operation always starts before the
// last one ends) do not starve a commit: the operation lock prefers the
// waiting commit, which runs between two creates. The creators stop only when
// the commits have returned, so a starved commit hangs this test (ctest's
// timeout) instead of passing.
TEST(ConcurrentWrite, CommitsAreNotStarvedByParallelCreates) {
  ScratchImage scratch;
  ASSERT_NO_FATAL_FAILURE(MakeScratchImage("cstarve", &scratch));
  const stdfs::path& dir = scratch.dir;
  const std::string& img = scratch.img;
  auto fs = Filesystem::Open(img, ubtrfs::OpenOptions{.writable = true});
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  constexpr int kCreators = 4;
  std::vector<InodeId> dirs;
  for (int t = 0; t < kCreators; ++t) {
    auto d = (*fs)->Mkdir((*fs)->Root(), "c" + std::to_string(t), NewInode{.mode = 0755});
    ASSERT_TRUE(d.ok());
    dirs.push_back(*d);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> created{0}, failures{0};
  std::vector<std::thread> creators;
  for (int t = 0; t < kCreators; ++t) {
    creators.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        if (!(*fs)->Create(dirs[t], "f" + std::to_string(i), NewInode{.mode = 0644}).ok()) failures.fetch_add(1);
        created.fetch_add(1);
      }
    });
  }
  while (created.load() < 200) std::this_thread::yield();
  const uint64_t before = ubtrfs::CollectStats().Counter("commit.count");
  for (int c = 0; c < 3; ++c) {
    ASSERT_TRUE((*fs)->Commit().ok());
    const int seen = created.load();
    while (created.load() < seen + 50) std::this_thread::yield();  // the creators go on between commits
  }
  stop = true;
  for (auto& th : creators) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(ubtrfs::CollectStats().Counter("commit.count"), before + 3);
  ASSERT_TRUE((*fs)->Commit().ok());
  fs->reset();
  EXPECT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  stdfs::remove_all(dir);
}

// Block groups emptied and deleted at commits (txn/unused_groups.cc) while
// other threads write on: each writer keeps its last kKeep files and
// unlinks the one before, so older data groups empty and go, and new
// chunks are made -- also while a commit's second half still holds the
// deleted chunks' device space. The committer commits all along. Every
// last file reads back, and btrfs check agrees with the image.
//
// How much is deleted while the writers run depends on how often the
// committer gets in: with few commits (a loaded machine), freed space is
// reused before a group empties. So the live data alone (2 x 9 x 4 MiB)
// outgrows mkfs's 64 MiB data group, which makes new chunks whatever the
// timing, and at the end every file goes: then all data groups but one
// must go too.
TEST(ConcurrentWrite, GroupsDeletedWhileOthersWrite) {
  ScratchImage scratch;
  ASSERT_NO_FATAL_FAILURE(MakeScratchImage("cgroups", &scratch));
  const std::string& img = scratch.img;
  constexpr int kWriters = 2, kRounds = 24, kKeep = 8;
  constexpr size_t kFile = 4 << 20;
  const uint64_t removed_before = ubtrfs::CollectStats().Counter("alloc.chunks_removed");
  {
    auto fs = Filesystem::Open(img, ubtrfs::OpenOptions{.writable = true});
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    std::atomic<int> running{kWriters}, failures{0};
    std::vector<std::thread> writers;
    for (int t = 0; t < kWriters; ++t) {
      writers.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(7 + t));
        const std::string chunk = Bytes(rng, 1 << 20);
        for (int r = 0; r < kRounds && failures.load() == 0; ++r) {
          const std::string name = "w" + std::to_string(t) + "-" + std::to_string(r);
          auto id = (*fs)->Create((*fs)->Root(), name, NewInode{.mode = 0644});
          if (!id.ok()) {
            ADD_FAILURE() << name << ": " << id.status().ToString();
            failures.fetch_add(1);
            break;
          }
          for (size_t off = 0; off < kFile; off += chunk.size()) {
            auto w = (*fs)->Write(*id, off, std::span(reinterpret_cast<const uint8_t*>(chunk.data()), chunk.size()));
            if (!w.ok()) {
              ADD_FAILURE() << name << ": " << w.status().ToString();
              failures.fetch_add(1);
              break;
            }
          }
          if (r >= kKeep) {
            const std::string prev = "w" + std::to_string(t) + "-" + std::to_string(r - kKeep);
            ubtrfs::Status st = (*fs)->Unlink((*fs)->Root(), prev);
            if (!st.ok()) {
              ADD_FAILURE() << prev << ": " << st.ToString();
              failures.fetch_add(1);
            }
          }
        }
        running.fetch_sub(1);
      });
    }
    while (running.load() > 0) {
      ubtrfs::Status st = (*fs)->Commit();
      if (!st.ok()) {
        ADD_FAILURE() << "commit: " << st.ToString();
        failures.fetch_add(1);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (auto& th : writers) th.join();
    ASSERT_EQ(failures.load(), 0);
    ASSERT_TRUE((*fs)->Commit().ok());
    for (int t = 0; t < kWriters; ++t) {
      std::mt19937 rng(static_cast<unsigned>(7 + t));
      const std::string chunk = Bytes(rng, 1 << 20);
      auto id = (*fs)->Lookup("/w" + std::to_string(t) + "-" + std::to_string(kRounds - 1));
      ASSERT_TRUE(id.ok()) << id.status().ToString();
      std::vector<uint8_t> got(kFile + 1);
      auto n = (*fs)->Read(*id, 0, got);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      ASSERT_EQ(*n, kFile);
      for (size_t off = 0; off < kFile; off += chunk.size()) {
        ASSERT_EQ(0, std::memcmp(got.data() + off, chunk.data(), chunk.size())) << "writer " << t << " at " << off;
      }
    }
    ASSERT_EQ(ubtrfs_test::BtrfsCheck(img), "");
    for (int t = 0; t < kWriters; ++t) {
      for (int r = kRounds - kKeep; r < kRounds; ++r) {
        const std::string name = "w" + std::to_string(t) + "-" + std::to_string(r);
        ASSERT_TRUE((*fs)->Unlink((*fs)->Root(), name).ok()) << name;
      }
    }
    ASSERT_TRUE((*fs)->Commit().ok());
  }
  EXPECT_GT(ubtrfs::CollectStats().Counter("alloc.chunks_removed"), removed_before) << "no group was deleted";
  EXPECT_EQ(ubtrfs_test::BtrfsCheck(img), "");
  const ubtrfs_test::ProgsSpace space = ubtrfs_test::SpaceFromDumpTree(img);
  ASSERT_EQ(space.data_groups, 1) << "data groups left with no file in the image";
  EXPECT_EQ(space.data_used, 0u);
  stdfs::remove_all(scratch.dir);
}

}  // namespace
