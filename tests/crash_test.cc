// Crash replay: workloads run through libubtrfs on a RecordingDevice that
// logs every write and flush; then, for many power-cut points in that log
// (every prefix of the short workloads, a random sample of the long ones,
// plus reordered subsets and torn writes of what was not yet flushed), the
// crashed image is opened with ubtrfs and must
//   - open without repair (no warning),
//   - pass our checker (src/check) and, on a sample, `btrfs check`,
//   - be at a generation between the last commit whose superblock write was
//     flushed before the crash and the last one whose superblock write was
//     issued, and equal, file by file and byte by byte, the model of the
//     workload after that commit -- never a mix of two commits.
//
// The model is kept by the workload itself (a map of paths to type, mode,
// content and xattrs), independent of the library; after every commit the
// live filesystem is compared with it too.
//
// UBTRFS_CRASH_SOAK=1 runs longer workloads and more crash points;
// UBTRFS_CRASH_SEED=N changes the seeds. Numbers are printed at the end
// ("crash suite: ...") and recorded in docs/RELIABILITY.md.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <condition_variable>
#include <mutex>

#include "alloc/chunk_map.h"
#include "check/checker.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "fs/import.h"
#include "fs/open_device.h"
#include "io/recording_device.h"
#include "stats/stats.h"
#include "support/mkfs_util.h"
#include "support/test_util.h"
#include "support/tree_gen.h"
#include "tree/cursor.h"
#include "txn/extent_relocation.h"
#include "txn/mkfs.h"
#include "txn/transaction.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"

namespace UBTRFS_UNITY_ID {

using namespace ubtrfs;
using io::CrashMode;
using io::CrashPoint;
using io::LogEntry;
using ubtrfs_test::TempDir;

bool Soak() {
  const char* e = std::getenv("UBTRFS_CRASH_SOAK");
  return e != nullptr && *e != '\0' && std::string(e) != "0";
}

uint64_t BaseSeed() {
  const char* e = std::getenv("UBTRFS_CRASH_SEED");
  return e != nullptr ? std::strtoull(e, nullptr, 10) : 1;
}

// ---- The model ---------------------------------------------------------------------------------

struct Node {
  char type = 'f';  // f file, d directory, l symlink, p fifo, c/b device, s socket
  uint32_t perm = 0;
  uint32_t uid = 0, gid = 0;
  std::shared_ptr<const std::string> data;  // file bytes or symlink target
  std::map<std::string, std::string> xattrs;
  uint64_t model_ino = 0;  // model bookkeeping for hard links; not compared

  bool operator==(const Node& o) const {
    const std::string empty;
    const std::string& a = data ? *data : empty;
    const std::string& b = o.data ? *o.data : empty;
    return type == o.type && perm == o.perm && uid == o.uid && gid == o.gid && a == b && xattrs == o.xattrs;
  }
};

// Paths relative to the top directory ("a", "a/b"); the top itself is "".
using State = std::map<std::string, Node>;

std::string Describe(const Node& n) {
  std::ostringstream s;
  s << n.type << " " << std::oct << n.perm << std::dec << " uid " << n.uid << " gid " << n.gid;
  if (n.data) s << " " << n.data->size() << " bytes";
  if (!n.xattrs.empty()) s << " " << n.xattrs.size() << " xattrs";
  return s.str();
}

// What differs between two states, at most `max` lines.
std::string Diff(const State& want, const State& got, size_t max = 8) {
  std::vector<std::string> out;
  for (const auto& [p, n] : want) {
    auto it = got.find(p);
    if (it == got.end()) {
      out.push_back("missing /" + p + " (" + Describe(n) + ")");
    } else if (!(it->second == n)) {
      std::string d = "differs /" + p + ": want " + Describe(n) + ", got " + Describe(it->second);
      if (n.data && it->second.data && n.data->size() == it->second.data->size()) {
        size_t i = 0;
        while (i < n.data->size() && (*n.data)[i] == (*it->second.data)[i]) ++i;
        d += " (first differing byte at " + std::to_string(i) + ")";
      }
      out.push_back(d);
    }
  }
  for (const auto& [p, n] : got) {
    if (!want.count(p)) out.push_back("unexpected /" + p + " (" + Describe(n) + ")");
  }
  std::string s;
  for (size_t i = 0; i < out.size() && i < max; ++i) s += "  " + out[i] + "\n";
  if (out.size() > max) s += "  ... " + std::to_string(out.size() - max) + " more\n";
  return s;
}

char TypeChar(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR: return 'd';
    case S_IFLNK: return 'l';
    case S_IFIFO: return 'p';
    case S_IFCHR: return 'c';
    case S_IFBLK: return 'b';
    case S_IFSOCK: return 's';
    default: return 'f';
  }
}

// The state of a filesystem as its read API shows it.
Result<State> Snapshot(Filesystem& fs) {
  State st;
  std::function<Status(InodeId, const std::string&)> walk = [&](InodeId dir, const std::string& prefix) -> Status {
    UB_ASSIGN_OR_RETURN(auto entries, fs.ReadDir(dir));
    for (const DirEntry& e : entries) {
      const std::string path = prefix.empty() ? e.name : prefix + "/" + e.name;
      UB_ASSIGN_OR_RETURN(Stat s, fs.GetStat(e.id));
      Node n;
      n.type = TypeChar(s.mode);
      n.perm = s.mode & 07777;
      n.uid = s.uid;
      n.gid = s.gid;
      if (n.type == 'f') {
        std::string data(s.size, '\0');
        size_t done = 0;
        while (done < data.size()) {
          UB_ASSIGN_OR_RETURN(size_t got, fs.Read(e.id, done, std::span(reinterpret_cast<uint8_t*>(data.data()) + done,
                                                                         data.size() - done)));
          if (got == 0) return Status::Corrupt("/" + path + ": short read at " + std::to_string(done));
          done += got;
        }
        n.data = std::make_shared<const std::string>(std::move(data));
      } else if (n.type == 'l') {
        UB_ASSIGN_OR_RETURN(std::string target, fs.ReadLink(e.id));
        n.data = std::make_shared<const std::string>(std::move(target));
      }
      UB_ASSIGN_OR_RETURN(auto names, fs.ListXattr(e.id));
      for (const auto& x : names) {
        UB_ASSIGN_OR_RETURN(std::string v, fs.GetXattr(e.id, x));
        n.xattrs[x] = std::move(v);
      }
      st[path] = std::move(n);
      if (s.mode && S_ISDIR(s.mode)) UB_RETURN_IF_ERROR(walk(e.id, path));
    }
    return Status::Ok();
  };
  UB_RETURN_IF_ERROR(walk(fs.Root(), ""));
  return st;
}

// The state of a host directory (the import workload's model), under `prefix`.
void HostSnapshot(const std::string& host, const std::string& prefix, State* st) {
  DIR* d = opendir(host.c_str());
  ASSERT_NE(d, nullptr) << host;
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
  }
  closedir(d);
  for (const auto& name : names) {
    const std::string hp = host + "/" + name, path = prefix + "/" + name;
    struct stat s;
    ASSERT_EQ(lstat(hp.c_str(), &s), 0) << hp;
    Node n;
    n.type = TypeChar(s.st_mode);
    n.perm = s.st_mode & 07777;
    n.uid = s.st_uid;
    n.gid = s.st_gid;
    if (n.type == 'f') {
      std::ifstream in(hp, std::ios::binary);
      n.data = std::make_shared<const std::string>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    } else if (n.type == 'l') {
      std::string t(4096, '\0');
      ssize_t len = readlink(hp.c_str(), t.data(), t.size());
      ASSERT_GE(len, 0) << hp;
      t.resize(static_cast<size_t>(len));
      n.data = std::make_shared<const std::string>(std::move(t));
    }
    std::string list(65536, '\0');
    ssize_t ll = llistxattr(hp.c_str(), list.data(), list.size());
    for (ssize_t pos = 0; ll > 0 && pos < ll;) {
      std::string x(list.data() + pos);
      pos += static_cast<ssize_t>(x.size()) + 1;
      std::string v(65536, '\0');
      ssize_t vl = lgetxattr(hp.c_str(), x.c_str(), v.data(), v.size());
      ASSERT_GE(vl, 0) << hp << " " << x;
      v.resize(static_cast<size_t>(vl));
      n.xattrs[x] = std::move(v);
    }
    (*st)[path] = n;
    if (n.type == 'd') HostSnapshot(hp, path, st);
  }
}

// ---- Workloads ---------------------------------------------------------------------------------

constexpr uint64_t kImageBytes = 128ull << 20;  // two superblock copies (64 KiB and 64 MiB)
// Small drop steps: a subvolume deletion commits many times, and crashes
// land in the middle of its drop.
constexpr uint64_t kDropBlocksPerCommit = 3;

// The generation in a primary superblock write, or 0 when the entry is not one.
uint64_t SuperGeneration(const LogEntry& e) {
  if (e.kind != LogEntry::Kind::kWrite || e.offset != format::SuperblockOffset(0) ||
      e.data.size() < sizeof(format::SuperBlock)) {
    return 0;
  }
  const auto* sb = reinterpret_cast<const format::SuperBlock*>(e.data.data());
  return sb->generation.get();
}

// In front of the recording device: once armed, the next write or flush
// from a thread other than the one that armed it waits until the test lets
// it go -- a commit held at the start of its second half (before its tree
// blocks are written: txn/commit_tail.h) while the arming thread changes
// the file system.
class GateDevice final : public io::BlockDevice {
 public:
  explicit GateDevice(io::BlockDevice* dev) : dev_(dev) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override { return dev_->ReadAt(offset, buf); }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override {
    Hold();
    return dev_->WriteAt(offset, buf);
  }
  Status Flush() override {
    Hold();
    return dev_->Flush();
  }
  uint64_t Size() const override { return dev_->Size(); }
  std::string Name() const override { return dev_->Name(); }
  void Arm() {
    std::lock_guard l(mu_);
    armer_ = std::this_thread::get_id();
    armed_ = true;
    entered_ = released_ = returned_ = false;
  }
  // Whether the armed flush was reached (false: `limit` passed, or the
  // caller said Returned() first: the commit ended without a flush).
  bool WaitEntered(std::chrono::seconds limit) {
    std::unique_lock l(mu_);
    cv_.wait_for(l, limit, [&] { return entered_ || returned_; });
    return entered_;
  }
  void Returned() {
    std::lock_guard l(mu_);
    returned_ = true;
    cv_.notify_all();
  }
  void Release() {
    std::lock_guard l(mu_);
    armed_ = false;
    released_ = true;
    cv_.notify_all();
  }

 private:
  void Hold() {
    std::unique_lock l(mu_);
    if (!armed_ || std::this_thread::get_id() == armer_) return;
    armed_ = false;
    entered_ = true;
    cv_.notify_all();
    cv_.wait(l, [&] { return released_; });
  }

  io::BlockDevice* dev_;
  std::thread::id armer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, entered_ = false, released_ = false, returned_ = false;
};

// A filesystem on a recording device, a model of it, and the model after
// every commit, by generation.
class WorkloadRun {
 public:
  explicit WorkloadRun(uint64_t seed, uint32_t nodesize = 16384)
      : rng_(seed), rec_("crash-image", kImageBytes), gate_(&rec_), nodesize_(nodesize) {}

  void Start() {
    txn::MkfsOptions o;
    o.nodesize = nodesize_;
    o.fsid = txn::Uuid{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    o.time_sec = 1700000000;
    o.data_bytes = data_bytes_;
    Status st = txn::MakeFilesystem(&rec_, o);
    ASSERT_TRUE(st.ok()) << st.ToString();
    rec_.ResetLog();
    OpenFs();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    generation_ = fs_->Info().generation;
    auto top = Snapshot(*fs_);
    ASSERT_TRUE(top.ok()) << top.status().ToString();
    ASSERT_TRUE(top->empty());
    states_[generation_] = model_;
  }

  // Commit() as fsync: afterwards the live view must equal the model, and the
  // model is what a crash after this point must show (or a later commit).
  void Commit() {
    Status st = fs_->Commit();
    ASSERT_TRUE(st.ok()) << st.ToString();
    const uint64_t gen = fs_->Info().generation;
    auto live = Snapshot(*fs_);
    ASSERT_TRUE(live.ok()) << live.status().ToString();
    ASSERT_TRUE(*live == model_) << "live view after commit " << gen << " differs from the model:\n"
                                 << Diff(model_, *live);
    if (gen != generation_) {
      ASSERT_EQ(gen, generation_ + 1) << "a commit happened outside Commit() (auto-commit?): its state is unknown";
      generation_ = gen;
      states_[gen] = model_;
    }
    ++commits_;
    events_.push_back(Durable{"", LastSuperWrite(before_commit_), rec_.log().size(), model_});
    before_commit_ = rec_.log().size();
  }

  // Commit() on a thread of its own, held before its first write while
  // `meanwhile` changes the file system from this thread: the next
  // transaction runs before this commit's superblocks are written. A crash
  // anywhere must show this commit's model (taken when it started, as
  // nothing could change while its first half ran), the one before, or a
  // later one -- never damage from the next transaction's writes.
  void CommitBehind(const std::function<void()>& meanwhile) {
    const State at_commit = model_;
    const size_t before = rec_.log().size();
    gate_.Arm();
    Status st;
    size_t done = 0;
    std::thread committer([&] {
      st = fs_->Commit();
      done = rec_.log().size();
      gate_.Returned();
    });
    const bool held = gate_.WaitEntered(std::chrono::seconds(120));
    if (held) meanwhile();
    gate_.Release();
    committer.join();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(held) << "the commit never reached its second half";
    const uint64_t gen = fs_->Info().generation;
    ASSERT_EQ(gen, generation_ + 1);
    generation_ = gen;
    states_[gen] = at_commit;
    ++commits_;
    ++commits_behind_;
    events_.push_back(Durable{"", LastSuperWrite(before), done, at_commit});
    before_commit_ = done;
    auto live = Snapshot(*fs_);
    ASSERT_TRUE(live.ok()) << live.status().ToString();
    ASSERT_TRUE(*live == model_) << "live view after a commit behind differs from the model:\n" << Diff(model_, *live);
  }
  int commits_behind() const { return commits_behind_; }
  // Before Start(): a node cache this small sends most reads to the device
  // (or to the blocks a commit holds until it has written them).
  void set_node_cache_bytes(size_t n) { node_cache_bytes_ = n; }
  // The data chunk mkfs makes (0: its default); before Start().
  void set_data_bytes(uint64_t n) { data_bytes_ = n; }

  // A point where something became durable: a commit (path empty) or an
  // fsync of `path` (through the tree log, or a commit where it fell back
  // to one). `super` is the log index of its superblock write (SIZE_MAX:
  // none; nothing changed), `done` the log size when the call returned
  // (its last flush included); `model` the whole model then.
  struct Durable {
    std::string path;
    size_t super = SIZE_MAX;
    size_t done = 0;
    State model;
  };
  void Fsync(const std::string& path) {
    const size_t before = rec_.log().size();
    Status st = fs_->Fsync(Id(path), false);
    ASSERT_TRUE(st.ok()) << "fsync " << path << ": " << st.ToString();
    const uint64_t gen = fs_->Info().generation;
    if (gen != generation_) {
      // It committed instead (a large log, new chunks): a commit like any.
      ASSERT_EQ(gen, generation_ + 1);
      generation_ = gen;
      states_[gen] = model_;
      ++commits_;
    }
    events_.push_back(Durable{path, LastSuperWrite(before), rec_.log().size(), model_});
    before_commit_ = rec_.log().size();
    ++fsyncs_;
  }
  const std::vector<Durable>& events() const { return events_; }
  int fsyncs() const { return fsyncs_; }

  void Finish() {
    Commit();
    fs_.reset();
  }

  // An offline operation (balance) on a transaction manager over the same
  // device, the filesystem closed meanwhile and opened again after. Nothing
  // a user sees may change: every generation it made shows the model.
  void Offline(const std::function<void(txn::TxnManager&)>& op) {
    Commit();
    fs_.reset();
    {
      txn::VolumeOptions vo;
      vo.writable = true;
      auto vol = txn::Volume::Open(io::NewUnownedDevice(&gate_), vo);
      ASSERT_TRUE(vol.ok()) << vol.status().ToString();
      auto txn = txn::TxnManager::Open(vol->get());
      ASSERT_TRUE(txn.ok()) << txn.status().ToString();
      op(**txn);
      if (::testing::Test::HasFatalFailure()) return;
    }
    OpenFs();
    if (::testing::Test::HasFatalFailure()) return;
    CommitsInside();
  }

  // After an operation that committed inside: every generation it made
  // shows the model as it is now; the live view must too.
  void CommitsInside() {
    const uint64_t gen = fs_->Info().generation;
    for (uint64_t g = generation_ + 1; g <= gen; ++g) states_[g] = model_;
    generation_ = gen;
    Commit();
  }

  // Checks the generation has not moved since the last Commit() (no commit
  // the model does not know of).
  void ExpectNoHiddenCommit() { ASSERT_EQ(fs_->Info().generation, generation_) << "an unexpected commit"; }

  Filesystem& fs() { return *fs_; }
  State& model() { return model_; }
  std::mt19937_64& rng() { return rng_; }
  const io::RecordingDevice& rec() const { return rec_; }
  const std::map<uint64_t, State>& states() const { return states_; }
  int commits() const { return commits_; }
  uint64_t longest_drop() const { return longest_drop_; }

  void OpenFs() {
    OpenOptions oo;
    oo.writable = true;
    oo.drop_blocks_per_commit = kDropBlocksPerCommit;
    if (node_cache_bytes_ != 0) oo.node_cache_bytes = node_cache_bytes_;
    auto fs = OpenOnDevice(io::NewUnownedDevice(&gate_), oo);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(*fs);
  }
  InodeId Id(const std::string& path) {
    auto r = fs_->Lookup("/" + path);
    EXPECT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    return r.ok() ? *r : InodeId{};
  }
  static std::string Parent(const std::string& path) {
    size_t s = path.rfind('/');
    return s == std::string::npos ? "" : path.substr(0, s);
  }
  static std::string Base(const std::string& path) {
    size_t s = path.rfind('/');
    return s == std::string::npos ? path : path.substr(s + 1);
  }
  std::string Bytes(size_t n) {
    std::string s(n, '\0');
    const uint8_t k = static_cast<uint8_t>(rng_());
    for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + k + (i >> 12) * 7) & 0xff);
    if (n > 0) s[rng_() % n] = static_cast<char>(rng_());
    return s;
  }

  // ---- Operations on both sides --------------------------------------------
  void Mkdir(const std::string& path, uint32_t perm = 0755) {
    NewInode a;
    a.mode = perm;
    auto r = fs_->Mkdir(Id(Parent(path)), Base(path), a);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    Node n;
    n.type = 'd';
    n.perm = perm;
    model_[path] = n;
  }
  void CreateFile(const std::string& path, const std::string& content, uint32_t perm = 0644) {
    NewInode a;
    a.mode = perm;
    auto r = fs_->Create(Id(Parent(path)), Base(path), a);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    if (!content.empty()) {
      auto w = fs_->Write(*r, 0, std::span(reinterpret_cast<const uint8_t*>(content.data()), content.size()));
      ASSERT_TRUE(w.ok()) << path << ": " << w.status().ToString();
      ASSERT_EQ(*w, content.size());
    }
    Node n;
    n.type = 'f';
    n.perm = perm;
    n.data = std::make_shared<const std::string>(content);
    n.model_ino = ++next_model_ino_;
    model_[path] = n;
  }
  void WriteAt(const std::string& path, uint64_t off, const std::string& bytes) {
    auto w = fs_->Write(Id(path), off, std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(w.ok()) << path << ": " << w.status().ToString();
    Node& n = model_.at(path);
    std::string d = *n.data;
    if (d.size() < off + bytes.size()) d.resize(off + bytes.size(), '\0');
    std::memcpy(d.data() + off, bytes.data(), bytes.size());
    SetAllLinks(n.model_ino, [&](Node& m) { m.data = std::make_shared<const std::string>(d); });
  }
  void Truncate(const std::string& path, uint64_t size) {
    AttrChange c;
    c.size = size;
    Status st = fs_->SetAttr(Id(path), c);
    ASSERT_TRUE(st.ok()) << path << ": " << st.ToString();
    Node& n = model_.at(path);
    std::string d = *n.data;
    d.resize(size, '\0');
    SetAllLinks(n.model_ino, [&](Node& m) { m.data = std::make_shared<const std::string>(d); });
  }
  void Symlink(const std::string& path, const std::string& target) {
    NewInode a;
    a.mode = 0777;
    auto r = fs_->Symlink(Id(Parent(path)), Base(path), target, a);
    ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    Node n;
    n.type = 'l';
    n.perm = 0777;
    n.data = std::make_shared<const std::string>(target);
    model_[path] = n;
  }
  void Link(const std::string& from, const std::string& to) {
    Status st = fs_->Link(Id(from), Id(Parent(to)), Base(to));
    ASSERT_TRUE(st.ok()) << from << " -> " << to << ": " << st.ToString();
    model_[to] = model_.at(from);
  }
  void Unlink(const std::string& path) {
    Status st = fs_->Unlink(Id(Parent(path)), Base(path));
    ASSERT_TRUE(st.ok()) << path << ": " << st.ToString();
    model_.erase(path);
  }
  void Rmdir(const std::string& path) {
    Status st = fs_->Rmdir(Id(Parent(path)), Base(path));
    ASSERT_TRUE(st.ok()) << path << ": " << st.ToString();
    model_.erase(path);
  }
  // Deletes a whole subtree, children first.
  void RemoveTree(const std::string& path) {
    std::vector<std::string> under;
    for (const auto& [p, n] : model_) {
      if (p.size() > path.size() && p.compare(0, path.size() + 1, path + "/") == 0) under.push_back(p);
    }
    std::sort(under.begin(), under.end(), [](const std::string& a, const std::string& b) { return a > b; });
    for (const auto& p : under) {
      if (model_.at(p).type == 'd') {
        Rmdir(p);
      } else {
        Unlink(p);
      }
    }
    Rmdir(path);
  }
  void Rename(const std::string& from, const std::string& to) {
    Status st = fs_->Rename(Id(Parent(from)), Base(from), Id(Parent(to)), Base(to));
    ASSERT_TRUE(st.ok()) << from << " -> " << to << ": " << st.ToString();
    State moved;
    for (auto it = model_.begin(); it != model_.end();) {
      const std::string& p = it->first;
      if (p == from || (p.size() > from.size() && p.compare(0, from.size() + 1, from + "/") == 0)) {
        moved[to + p.substr(from.size())] = it->second;
        it = model_.erase(it);
      } else {
        ++it;
      }
    }
    model_.erase(to);  // replaced (a file, or an empty directory)
    for (auto& [p, n] : moved) model_[p] = n;
  }
  void SetXattr(const std::string& path, const std::string& name, const std::string& value) {
    Status st = fs_->SetXattr(Id(path), name, value, 0);
    ASSERT_TRUE(st.ok()) << path << ": " << st.ToString();
    Node& n = model_.at(path);
    if (n.type == 'f') {
      SetAllLinks(n.model_ino, [&](Node& m) { m.xattrs[name] = value; });
    } else {
      n.xattrs[name] = value;
    }
  }
  void Chmod(const std::string& path, uint32_t perm) {
    AttrChange c;
    c.mode = perm;
    Status st = fs_->SetAttr(Id(path), c);
    ASSERT_TRUE(st.ok()) << path << ": " << st.ToString();
    Node& n = model_.at(path);
    if (n.type == 'f') {
      SetAllLinks(n.model_ino, [&](Node& m) { m.perm = perm; });
    } else {
      n.perm = perm;
    }
  }

  // Subvolume operations commit inside (before and after, and a deletion
  // once per drop step): the workload commits first, so that every
  // generation they make shows the state after them.
  void CreateSubvolume(const std::string& path) {
    Commit();
    auto r = fs_->CreateSubvolume(Id(Parent(path)), Base(path), NewInode{0755});
    ASSERT_TRUE(r.ok()) << path << ": " << r.status().ToString();
    Node n;
    n.type = 'd';
    n.perm = 0755;
    model_[path] = n;
    CommitsInside();
  }
  void TakeSnapshot(const std::string& from, const std::string& to, bool read_only) {
    Commit();
    auto r = fs_->CreateSnapshot(Id(from), Id(Parent(to)), Base(to), read_only);
    ASSERT_TRUE(r.ok()) << from << " -> " << to << ": " << r.status().ToString();
    State copy;
    for (const auto& [p, n] : model_) {
      if (p == from) copy[to] = n;
      if (p.compare(0, from.size() + 1, from + "/") == 0) {
        Node m = n;
        if (m.type == 'f') m.model_ino += kSnapshotInoStep * static_cast<uint64_t>(++snapshots_);  // links stay within a copy
        copy[to + p.substr(from.size())] = m;
      }
    }
    for (auto& [p, n] : copy) model_[p] = n;
    CommitsInside();
  }
  void DeleteSubvolume(const std::string& path) {
    Commit();
    const uint64_t before = fs_->Info().generation;
    Status st = fs_->DeleteSubvolume(Id(Parent(path)), Base(path));
    ASSERT_TRUE(st.ok()) << path << ": " << st.ToString();
    longest_drop_ = std::max(longest_drop_, fs_->Info().generation - before);
    for (auto it = model_.begin(); it != model_.end();) {
      const std::string& p = it->first;
      it = (p == path || p.compare(0, path.size() + 1, path + "/") == 0) ? model_.erase(it) : std::next(it);
    }
    CommitsInside();
  }
  // A reflink copy of a whole file into a new one.
  void CloneFile(const std::string& from, const std::string& to) {
    const Node src = model_.at(from);
    NewInode a;
    a.mode = src.perm;
    auto dst = fs_->Create(Id(Parent(to)), Base(to), a);
    ASSERT_TRUE(dst.ok()) << to << ": " << dst.status().ToString();
    Status st = fs_->Clone(Id(from), 0, *dst, 0, 0);  // to the source's end
    ASSERT_TRUE(st.ok()) << from << " -> " << to << ": " << st.ToString();
    Node n;
    n.type = 'f';
    n.perm = src.perm;
    n.data = src.data;
    n.model_ino = ++next_model_ino_;
    model_[to] = n;
  }

  // Random existing path of a kind ('f', 'd', 'l', 0 = any), "" if none.
  std::string Pick(char type) {
    std::vector<std::string> c;
    for (const auto& [p, n] : model_) {
      if (type == 0 || n.type == type) c.push_back(p);
    }
    return c.empty() ? "" : c[rng_() % c.size()];
  }
  bool IsEmptyDir(const std::string& path) {
    auto it = model_.upper_bound(path);
    return !(it != model_.end() && it->first.compare(0, path.size() + 1, path + "/") == 0);
  }
  // A fresh name in a random directory.
  std::string FreshPath() {
    std::vector<std::string> dirs{""};
    for (const auto& [p, n] : model_) {
      if (n.type == 'd') dirs.push_back(p);
    }
    const std::string& d = dirs[rng_() % dirs.size()];
    for (;;) {
      std::string name = "n" + std::to_string(rng_() % 1000);
      std::string p = d.empty() ? name : d + "/" + name;
      if (!model_.count(p)) return p;
    }
  }

 private:
  void SetAllLinks(uint64_t ino, const std::function<void(Node&)>& f) {
    for (auto& [p, n] : model_) {
      if (n.model_ino == ino && n.type == 'f') f(n);
    }
  }

  std::mt19937_64 rng_;
  io::RecordingDevice rec_;
  GateDevice gate_;
  std::unique_ptr<Filesystem> fs_;
  State model_;
  std::map<uint64_t, State> states_;
  std::vector<Durable> events_;
  size_t before_commit_ = 0;
  int fsyncs_ = 0;
  // The last primary superblock write from log index `from` on.
  size_t LastSuperWrite(size_t from) const {
    size_t at = SIZE_MAX;
    const auto& log = rec_.log();
    for (size_t i = from; i < log.size(); ++i) {
      if (log[i].kind == LogEntry::Kind::kWrite && log[i].offset == format::SuperblockOffset(0)) at = i;
    }
    return at;
  }
  uint64_t generation_ = 0;
  uint64_t next_model_ino_ = 0;
  int commits_ = 0;
  int commits_behind_ = 0;
  size_t node_cache_bytes_ = 0;
  uint64_t data_bytes_ = 0;
  uint32_t nodesize_;
  int snapshots_ = 0;
  uint64_t longest_drop_ = 0;  // commits of the longest subvolume deletion
  static constexpr uint64_t kSnapshotInoStep = 1ull << 32;
};

// Namespace churn: creates, links, unlinks, renames, directories, symlinks,
// xattrs and chmods, committed every few operations.
void ChurnWorkload(WorkloadRun& r, int ops) {
  int since_commit = 0, commit_every = 1;
  for (int i = 0; i < ops; ++i) {
    const int op = static_cast<int>(r.rng()() % 100);
    if (op < 22) {
      r.CreateFile(r.FreshPath(), r.Bytes(r.rng()() % 3 == 0 ? r.rng()() % 3000 : r.rng()() % 100));
    } else if (op < 32) {
      r.Mkdir(r.FreshPath());
    } else if (op < 44) {
      std::string f = r.Pick('f');
      if (!f.empty()) r.Unlink(f);
    } else if (op < 50) {
      std::string d = r.Pick('d');
      if (!d.empty() && r.IsEmptyDir(d)) r.Rmdir(d);
    } else if (op < 64) {
      std::string f = r.Pick(r.rng()() % 4 == 0 ? 'd' : 'f');
      if (f.empty()) continue;
      std::string to;
      if (r.model().at(f).type == 'f' && r.rng()() % 2) {
        to = r.Pick('f');  // over an existing file
        if (to == f) continue;
      }
      if (to.empty()) to = r.FreshPath();
      if (to.compare(0, f.size() + 1, f + "/") == 0) continue;  // into itself
      r.Rename(f, to);
    } else if (op < 70) {
      std::string f = r.Pick('f');
      if (!f.empty()) r.Link(f, r.FreshPath());
    } else if (op < 76) {
      r.Symlink(r.FreshPath(), "target-" + std::to_string(r.rng()() % 100000));
    } else if (op < 86) {
      std::string f = r.Pick(0);
      if (!f.empty() && r.model().at(f).type != 'l') {
        r.SetXattr(f, "user.k" + std::to_string(r.rng()() % 3), r.Bytes(r.rng()() % 200));
      }
    } else if (op < 92) {
      std::string f = r.Pick('f');
      if (!f.empty()) r.Chmod(f, 0600 | static_cast<uint32_t>(r.rng()() % 0100));
    } else {
      std::string f = r.Pick('f');
      if (!f.empty()) r.WriteAt(f, r.rng()() % 6000, r.Bytes(1 + r.rng()() % 5000));
    }
    if (::testing::Test::HasFatalFailure()) return;
    if (++since_commit >= commit_every) {
      r.Commit();
      since_commit = 0;
      commit_every = 1 + static_cast<int>(r.rng()() % 4);
    }
  }
}

// Commits whose second half runs while the next transaction's changes go
// on (txn/commit_tail.h): meanwhile files of this and earlier commits are
// unlinked and overwritten (their blocks and extents freed: pinned until
// the superblock is on disk) and new ones written; after it, more changes
// take space before the next commit; now and then an fsync follows.
void CommitBehindWorkload(WorkloadRun& r, int rounds) {
  r.Mkdir("d");
  for (int f = 0; f < 6; ++f) r.CreateFile("d/f" + std::to_string(f), r.Bytes(r.rng()() % 20000));
  r.Commit();
  auto churn = [&](int n) {
    for (int i = 0; i < n && !::testing::Test::HasFatalFailure(); ++i) {
      const int op = static_cast<int>(r.rng()() % 10);
      std::string f = r.Pick('f');
      if (op < 3 || f.empty()) {
        r.CreateFile(r.FreshPath(), r.Bytes(r.rng()() % 2 ? r.rng()() % 200 : 4096 + r.rng()() % 30000));
      } else if (op < 5) {
        r.Unlink(f);
      } else if (op < 8) {
        r.WriteAt(f, r.rng()() % 8192, r.Bytes(1 + r.rng()() % 12000));
      } else {
        r.Mkdir(r.FreshPath());
      }
    }
  };
  for (int round = 0; round < rounds && !::testing::Test::HasFatalFailure(); ++round) {
    churn(3);
    if (::testing::Test::HasFatalFailure()) return;
    r.CommitBehind([&] { churn(4); });
    if (::testing::Test::HasFatalFailure()) return;
    churn(2);
    if (::testing::Test::HasFatalFailure()) return;
    if (round % 3 == 2) {
      std::string f = r.Pick('f');
      if (!f.empty()) r.Fsync(f);
    }
  }
  EXPECT_GE(r.commits_behind(), rounds);
}

// Block groups emptied by deletions go with their chunks in the commit
// that empties them (txn/unused_groups.cc), and their device space must
// stay untouched until that commit is on disk. Here the next transaction,
// running while the deleting commit's superblock is held back, needs a new
// data chunk, and the lowest hole on the device is where deleted chunks
// were. mkfs makes a data chunk of 4 MiB (set_data_bytes); the first
// round's file fills it, a new 12 MiB chunk and part of another, and is
// deleted: the first two go (16 MiB of device, next to each other), the
// third stays (the last data group). The new chunk of the transaction
// behind must go elsewhere; placed there, its data would overwrite the
// deleted file's, which a crash before the superblock still shows (this
// fails with the space released at once: tried).
void EmptiedGroupsWorkload(WorkloadRun& r, int rounds) {
  static stats::Counter& removed = stats::GetCounter("alloc.chunks_removed");
  // In 1 MiB writes: extents no larger than that, chunks of the target size.
  auto create = [&](const std::string& path, size_t mib) {
    r.CreateFile(path, "");
    for (size_t i = 0; i < mib && !::testing::Test::HasFatalFailure(); ++i) r.WriteAt(path, i << 20, r.Bytes(1 << 20));
  };
  for (int round = 0; round < rounds && !::testing::Test::HasFatalFailure(); ++round) {
    create("a", 20);
    r.Commit();
    if (::testing::Test::HasFatalFailure()) return;
    const uint64_t removed_then = removed.Get();
    r.Unlink("a");
    r.CommitBehind([&] { create("b", 16); });
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_GE(removed.Get() - removed_then, 1u) << "round " << round << ": the emptied group is still there";
    r.Commit();
    r.Unlink("b");
    r.Commit();
  }
}

// Appends with Commit as fsync after each: small ones (inline extents that
// turn regular), unaligned ones, and some overwrites inside the file.
void AppendWorkload(WorkloadRun& r, int appends) {
  for (int f = 0; f < 3; ++f) r.CreateFile("log" + std::to_string(f), "");
  r.Commit();
  for (int i = 0; i < appends; ++i) {
    const std::string f = "log" + std::to_string(r.rng()() % 3);
    const size_t size = r.model().at(f).data->size();
    const int kind = static_cast<int>(r.rng()() % 10);
    size_t len = kind < 5 ? 1 + r.rng()() % 700 : (kind < 9 ? 1 + r.rng()() % 20000 : 65536 + r.rng()() % 70000);
    r.WriteAt(f, size, r.Bytes(len));
    if (r.rng()() % 6 == 0 && size > 0) r.WriteAt(f, r.rng()() % size, r.Bytes(1 + r.rng()() % 3000));
    if (::testing::Test::HasFatalFailure()) return;
    r.Commit();
  }
}

// fsync through the tree log, in the patterns of the issue and of
// applications: appends (a database's journal), renames of fsynced files
// (atomic replace), a new file in a new directory, fsync of a directory
// after an unlink, a truncate, an xattr; a commit now and then ends a log.
void FsyncLogWorkload(WorkloadRun& r, int ops) {
  r.Mkdir("db");
  for (int f = 0; f < 3; ++f) r.CreateFile("db/log" + std::to_string(f), r.Bytes(3000 * f));
  r.CreateFile("db/old", r.Bytes(20000));
  r.Commit();
  int dirs = 0, tmps = 0;
  for (int i = 0; i < ops && !::testing::Test::HasFatalFailure(); ++i) {
    const int kind = static_cast<int>(r.rng()() % 20);
    if (kind < 8) {  // append and fsync
      const std::string f = "db/log" + std::to_string(r.rng()() % 3);
      const size_t size = r.model().at(f).data->size();
      r.WriteAt(f, size, r.Bytes(r.rng()() % 3 ? 1 + r.rng()() % 5000 : 4096));
      if (r.rng()() % 4 == 0 && size > 0) r.WriteAt(f, r.rng()() % size, r.Bytes(1 + r.rng()() % 3000));
      r.Fsync(f);
    } else if (kind < 11) {  // atomic replace: write, fsync, rename over, fsync
      const std::string target = "db/cfg" + std::to_string(r.rng()() % 2);
      const std::string tmp = "db/tmp" + std::to_string(tmps++);
      r.CreateFile(tmp, r.Bytes(r.rng()() % 2 ? r.rng()() % 1500 : r.rng()() % 30000));
      if (r.rng()() % 2) r.SetXattr(tmp, "user.v", std::to_string(i));
      r.Fsync(tmp);
      r.Rename(tmp, target);
      r.Fsync(target);
    } else if (kind < 14) {  // a new file in a new directory
      const std::string d = "new" + std::to_string(dirs++);
      r.Mkdir(d);
      if (r.rng()() % 2) r.Mkdir(d + "/sub");
      const std::string f = r.model().count(d + "/sub") ? d + "/sub/f" : d + "/f";
      r.CreateFile(f, r.Bytes(r.rng()() % 20000));
      r.Fsync(f);
    } else if (kind < 16) {  // unlink, then fsync the directory
      std::vector<std::string> files;
      for (const auto& [p, n] : r.model()) {
        if (n.type == 'f' && p.rfind("db/log", 0) != 0) files.push_back(p);
      }
      if (files.empty()) continue;
      const std::string victim = files[r.rng()() % files.size()];
      r.Unlink(victim);
      r.Fsync(WorkloadRun::Parent(victim));
    } else if (kind < 17) {  // a directory moved to another, a file in it fsynced
      std::vector<std::string> ds;
      for (const auto& [p, n] : r.model()) {
        if (n.type == 'd' && p.rfind("new", 0) == 0 && p.find('/') == std::string::npos) ds.push_back(p);
      }
      if (ds.size() < 2) continue;
      const std::string from = ds[r.rng()() % ds.size()];
      std::string to = ds[r.rng()() % ds.size()];
      if (to == from) continue;
      const std::string moved = to + "/moved" + std::to_string(i);
      r.Rename(from, moved);
      r.CreateFile(moved + "/g", r.Bytes(r.rng()() % 5000));
      r.Fsync(moved + "/g");
    } else if (kind < 18) {  // truncate (leaving a hole past the new end) and fsync
      const std::string f = "db/log" + std::to_string(r.rng()() % 3);
      const size_t size = r.model().at(f).data->size();
      r.Truncate(f, size / 3);
      r.WriteAt(f, size / 3 + 10000, r.Bytes(100));
      r.Fsync(f);
    } else if (kind < 19) {
      r.Commit();
    } else {  // a hard link, then fsync of the file
      const std::string f = "db/log" + std::to_string(r.rng()() % 3);
      const std::string l = "db/link" + std::to_string(i);
      r.Link(f, l);
      r.Fsync(l);
    }
  }
}

// The atomic-replace pattern: write a temporary file, commit (fsync), rename
// it over the real one, commit; sometimes without the first commit.
void RenameOverWorkload(WorkloadRun& r, int rounds) {
  r.Mkdir("cfg");
  for (int f = 0; f < 4; ++f) r.CreateFile("cfg/file" + std::to_string(f), r.Bytes(500 + f * 3000));
  r.Commit();
  for (int i = 0; i < rounds; ++i) {
    const std::string target = "cfg/file" + std::to_string(r.rng()() % 4);
    const std::string tmp = target + ".tmp";
    const size_t len = r.rng()() % 2 ? r.rng()() % 2048 : r.rng()() % 40000;
    r.CreateFile(tmp, r.Bytes(len));
    if (r.rng()() % 2) r.SetXattr(tmp, "user.version", std::to_string(i));
    if (r.rng()() % 3) r.Commit();
    r.Rename(tmp, target);
    if (::testing::Test::HasFatalFailure()) return;
    r.Commit();
  }
}

// Directory trees created, committed, and deleted again.
void TreesWorkload(WorkloadRun& r, int rounds) {
  for (int i = 0; i < rounds; ++i) {
    const std::string top = "tree" + std::to_string(i % 3);
    if (r.model().count(top)) {
      r.RemoveTree(top);
      r.Commit();
    }
    r.Mkdir(top);
    const int fan = 2 + static_cast<int>(r.rng()() % 3);
    for (int a = 0; a < fan; ++a) {
      const std::string d = top + "/d" + std::to_string(a);
      r.Mkdir(d);
      for (int b = 0; b < fan; ++b) {
        const std::string e = d + "/e" + std::to_string(b);
        r.Mkdir(e);
        for (int c = 0; c < 3; ++c) {
          r.CreateFile(e + "/f" + std::to_string(c), r.Bytes(r.rng()() % 2 ? 40 : 5000 + r.rng()() % 9000));
        }
        r.Symlink(e + "/link", "../../f");
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
    r.Commit();
  }
}

// A subvolume of a few hundred files (4 KiB nodes: a tree of two levels),
// snapshots of it (some read-only) and of those, changes on every writable
// side, reflinks across subvolumes, and deletions of snapshots and, last, of
// the source, each dropped in many small committed steps.
void SubvolumesWorkload(WorkloadRun& r, int rounds) {
  r.CreateSubvolume("sv");
  r.Mkdir("sv/d");
  for (int i = 0; i < 260; ++i) r.CreateFile("sv/d/f" + std::to_string(i), r.Bytes(i % 4 == 0 ? 4000 + i : 50 + i));
  r.Commit();
  std::vector<std::string> rw{"sv"}, snaps;
  auto any_file = [&](const std::string& top) {
    std::vector<std::string> c;
    for (const auto& [p, n] : r.model()) {
      if (n.type == 'f' && p.compare(0, top.size() + 1, top + "/") == 0) c.push_back(p);
    }
    return c.empty() ? std::string() : c[r.rng()() % c.size()];
  };
  for (int round = 0; round < rounds; ++round) {
    const std::string src = rw[r.rng()() % rw.size()];
    const std::string snap = "snap" + std::to_string(round);
    const bool ro = round % 3 == 1;
    r.TakeSnapshot(src, snap, ro);
    snaps.push_back(snap);
    if (!ro) rw.push_back(snap);
    if (::testing::Test::HasFatalFailure()) return;
    for (int k = 0; k < 12; ++k) {
      const std::string top = rw[r.rng()() % rw.size()];
      const std::string f = any_file(top);
      if (f.empty()) continue;
      const int op = static_cast<int>(r.rng()() % 4);
      if (op == 0) {
        r.Unlink(f);
      } else if (op == 1) {
        const std::string from = any_file(snaps[r.rng()() % snaps.size()]);
        const std::string to = top + "/d/c" + std::to_string(round) + "_" + std::to_string(k);
        if (!from.empty() && !r.model().count(to)) r.CloneFile(from, to);
      } else {
        r.WriteAt(f, r.rng()() % 5000, r.Bytes(1 + r.rng()() % 3000));
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
    r.Commit();
    if (snaps.size() > 2) {
      const size_t i = r.rng()() % (snaps.size() - 1);
      const std::string gone = snaps[i];
      r.DeleteSubvolume(gone);
      snaps.erase(snaps.begin() + static_cast<long>(i));
      rw.erase(std::remove(rw.begin(), rw.end(), gone), rw.end());
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  // The source goes while snapshots share its blocks; they change after.
  r.DeleteSubvolume("sv");
  EXPECT_GE(r.longest_drop(), 4u) << "no deletion was dropped in steps: no crash lands inside a drop";
  rw.erase(std::remove(rw.begin(), rw.end(), std::string("sv")), rw.end());
  for (const std::string& top : rw) {
    for (int k = 0; k < 6; ++k) {
      const std::string f = any_file(top);
      if (!f.empty()) r.WriteAt(f, r.rng()() % 3000, r.Bytes(1 + r.rng()() % 2000));
    }
  }
  r.Commit();
}

// Extents moved to new logical addresses (balance -dusage/-musage) under
// snapshots that share blocks and data, changed on both sides: nothing a
// user sees changes, so a crash anywhere in the moves shows the files as
// they were, and writes after them go on over the moved blocks.
void RelocationWorkload(WorkloadRun& r, int rounds) {
  r.CreateSubvolume("sv");
  r.Mkdir("sv/d");
  for (int i = 0; i < 200; ++i) r.CreateFile("sv/d/f" + std::to_string(i), r.Bytes(i % 3 == 0 ? 9000 + 40 * i : 60 + i));
  r.Commit();
  r.TakeSnapshot("sv", "snap", false);
  for (int i = 0; i < 200; i += 7) r.Unlink("sv/d/f" + std::to_string(i));
  for (int i = 3; i < 200; i += 9) r.WriteAt("snap/d/f" + std::to_string(i), 100, r.Bytes(3000));
  r.CloneFile("snap/d/f3", "sv/d/clone");
  r.Commit();
  r.TakeSnapshot("sv", "ro", true);
  if (::testing::Test::HasFatalFailure()) return;
  for (int round = 0; round < rounds; ++round) {
    r.Offline([&](txn::TxnManager& t) {
      std::vector<uint64_t> groups;
      t.space().ForEachGroup([&](const alloc::BlockGroup& g) {
        const uint64_t kind = g.flags() & format::kBlockGroupTypeMask;
        if (kind == format::kBlockGroupData || kind == format::kBlockGroupMetadata) groups.push_back(g.start());
      });
      txn::RelocationStats stats;
      for (uint64_t g : groups) {
        auto gone = txn::RelocateGroup(t, g, &stats);
        ASSERT_TRUE(gone.ok()) << gone.status().ToString();
        EXPECT_TRUE(*gone) << "block group " << g << " stays";
      }
      EXPECT_GT(stats.data_extents, 0u);
      EXPECT_GT(stats.tree_blocks, 0u);
      for (const std::string& n : stats.notes) ADD_FAILURE() << n;
    });
    if (::testing::Test::HasFatalFailure()) return;
    for (int i = 1 + round; i < 200; i += 11) {
      const std::string f = (i % 2 ? "sv/d/f" : "snap/d/f") + std::to_string(i);
      if (r.model().count(f)) r.WriteAt(f, 50, r.Bytes(2000));
    }
    r.Commit();
  }
}

// Generated host trees imported through the library (fs/import.h), one
// commit after each.
void ImportWorkload(WorkloadRun& r, const std::string& host_dir, int trees, size_t entries) {
  for (int t = 0; t < trees; ++t) {
    const std::string src = host_dir + "/src" + std::to_string(t);
    ASSERT_EQ(mkdir(src.c_str(), 0755), 0);
    ubtrfs_test::TreeGenOptions o = ubtrfs_test::ScaledTreeOptions(entries);
    o.large_files = 1;
    o.large_file_max = 600 * 1024;
    o.sparse_files = 1;
    o.sparse_file_max = 4ull << 20;
    o.deep_depth = 6;
    o.wide_dir_entries = entries / 3;
    o.many_links = false;
    ubtrfs_test::GenerateTree(src, BaseSeed() * 100 + static_cast<uint64_t>(t), o);
    fs::ImportOptions io;
    io.commit_every_bytes = UINT64_MAX;  // one commit per tree, by the workload
    const std::string name = "import" + std::to_string(t);
    Status st = fs::ImportTree(r.fs(), src, r.fs().Root(), name, io);
    ASSERT_TRUE(st.ok()) << st.ToString();
    State host;
    Node top;
    {
      struct stat s;
      ASSERT_EQ(lstat(src.c_str(), &s), 0);
      top.type = 'd';
      top.perm = s.st_mode & 07777;
      top.uid = s.st_uid;
      top.gid = s.st_gid;
    }
    HostSnapshot(src, name, &host);
    std::string list(65536, '\0');
    ssize_t ll = llistxattr(src.c_str(), list.data(), list.size());
    for (ssize_t pos = 0; ll > 0 && pos < ll;) {
      std::string x(list.data() + pos);
      pos += static_cast<ssize_t>(x.size()) + 1;
      std::string v(65536, '\0');
      ssize_t vl = lgetxattr(src.c_str(), x.c_str(), v.data(), v.size());
      if (vl >= 0) top.xattrs[x] = v.substr(0, static_cast<size_t>(vl));
    }
    r.model()[name] = top;
    for (auto& [p, n] : host) r.model()[p] = n;
    r.Commit();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// ---- Crash points ------------------------------------------------------------------------------

// Forwards to a device and remembers what was read (the tree blocks a check
// visited), for comparing their DUP copies afterwards: the reader stops at
// the first good copy, so a committed block whose second copy was
// overwritten would otherwise go unseen.
class ReadLog final : public io::BlockDevice {
 public:
  ReadLog(std::unique_ptr<io::BlockDevice> dev, std::vector<std::pair<uint64_t, uint64_t>>* reads)
      : dev_(std::move(dev)), reads_(reads) {}
  Status ReadAt(uint64_t offset, std::span<uint8_t> buf) override {
    reads_->emplace_back(offset, buf.size());
    return dev_->ReadAt(offset, buf);
  }
  Status WriteAt(uint64_t offset, std::span<const uint8_t> buf) override { return dev_->WriteAt(offset, buf); }
  Status Flush() override { return dev_->Flush(); }
  uint64_t Size() const override { return dev_->Size(); }
  std::string Name() const override { return dev_->Name(); }

 private:
  std::unique_ptr<io::BlockDevice> dev_;
  std::vector<std::pair<uint64_t, uint64_t>>* reads_;
};

// Every copy of each tree block read at `reads` (physical offsets) must hold
// the same bytes; returns what differs.
std::string CompareDupCopies(const io::CrashImage& img, const alloc::ChunkMap& chunks,
                             const std::vector<std::pair<uint64_t, uint64_t>>& reads, uint32_t nodesize) {
  std::set<uint64_t> done;
  std::string out;
  for (const auto& [phys, len] : reads) {
    if (len != nodesize || !done.insert(phys).second) continue;
    for (const auto& [logical, c] : chunks.chunks()) {
      if (c.stripes.size() < 2) continue;
      for (const auto& st : c.stripes) {
        const uint64_t start = st.physical;
        if (phys < start || phys + len > start + c.length) continue;
        const uint64_t off = phys - start;
        std::vector<uint8_t> a(len), b(len);
        img.image().Read(c.stripes[0].physical + off, a);
        for (size_t k = 1; k < c.stripes.size(); ++k) {
          img.image().Read(c.stripes[k].physical + off, b);
          if (a != b) {
            out += "tree block at logical " + std::to_string(logical + off) + ": copy " + std::to_string(k) +
                   " differs from copy 0\n";
          }
        }
      }
    }
  }
  return out;
}

struct Totals {
  int workloads = 0;
  uint64_t log_entries = 0;
  uint64_t commits = 0;
  uint64_t points = 0;
  std::map<CrashMode, uint64_t> by_mode;
  uint64_t btrfs_checks = 0;
  uint64_t btrfs_check_super_points = 0;
  uint64_t failures = 0;
  uint64_t older_state = 0;  // crash images at the older of two allowed generations
  uint64_t log_replays = 0;  // crash images with an fsync's tree log
  uint64_t kernel_replays = 0;
  double seconds = 0, btrfs_seconds = 0;
};

Totals& GlobalTotals() {
  static Totals t;
  return t;
}

// How a workload's crash points are chosen.
struct Plan {
  bool every_prefix = true;  // else `sample` random prefixes
  size_t sample = 0;
  int subset_seeds = 2;       // kSubset points at each sampled point with unflushed writes
  int torn_seeds = 2;         // kTorn points likewise
  double btrfs_fraction = 0.02;  // of the other points, besides those at superblock writes
};

class CrashVerifier {
 public:
  CrashVerifier(const WorkloadRun& run, std::string scratch, std::string name)
      : run_(run), rep_(&run.rec()), scratch_(std::move(scratch)), name_(std::move(name)) {
    // btrfs writes each 4 KiB superblock copy as one unit and relies on it
    // landing whole (a torn primary is refused by the kernel and btrfs
    // check); TornPrimarySuperblock below covers what ubtrfs does then.
    for (int m = 0; m < format::kSuperMirrorMax; ++m) {
      rep_.AddAtomicRange(format::SuperblockOffset(m), format::kSuperInfoSize);
    }
    const auto& log = run.rec().log();
    gen_issued_.resize(log.size() + 1);
    uint64_t g = run.states().begin()->first;  // mkfs
    for (size_t i = 0; i < log.size(); ++i) {
      gen_issued_[i] = g;
      if (uint64_t sg = SuperGeneration(log[i])) {
        g = std::max(g, sg);
        super_writes_.insert(i);
      }
    }
    gen_issued_[log.size()] = g;
  }

  // Generation of the newest superblock written among the first n entries.
  uint64_t GenIssued(size_t n) const { return gen_issued_[n]; }

  // What is wrong with a crash image that may show generations lo..hi
  // ("" when nothing). Counts btrfs checks and older states in the totals.
  // Every fsync whose last flush is durable: its path holds what it held
  // then, or what it held at a later durability point already issued (a
  // later fsync logs changed inodes again; a later commit).
  std::string CheckFsynced(const State& got, size_t durable, size_t issued) const {
    std::string out;
    const auto& ev = run_.events();
    for (size_t k = 0; k < ev.size(); ++k) {
      if (ev[k].path.empty() || ev[k].done > durable) continue;
      const std::string& path = ev[k].path;
      auto have = got.find(path);
      bool ok = false;
      std::string wanted;
      for (size_t j = k; j < ev.size() && !ok; ++j) {
        if (j > k && (ev[j].super == SIZE_MAX || ev[j].super >= issued)) continue;
        auto want = ev[j].model.find(path);
        if (want == ev[j].model.end()) {
          ok = have == got.end();
          wanted += " absent;";
        } else {
          ok = have != got.end() && have->second == want->second;
          wanted += " " + Describe(want->second) + ";";
        }
      }
      if (!ok) {
        out += "fsynced /" + path + " (fsync " + std::to_string(k) + ") is " +
               (have == got.end() ? std::string("missing") : Describe(have->second)) + ", want one of:" + wanted + "\n";
      }
    }
    return out;
  }

  // A writable open replays the log and commits: the checker passes and the
  // tree is what the read-only open showed; btrfs check and, on a sample,
  // the kernel agree.
  std::string ReplayWritable(const io::CrashImage& img, const State& shown) {
    auto copy = img.Clone();
    {
      OpenOptions o;
      o.writable = true;
      auto fs = OpenOnDevice(io::NewUnownedDevice(copy.get()), o);
      if (!fs.ok()) return "does not open writable (replaying the log): " + fs.status().ToString() + "\n";
      auto snap = Snapshot(**fs);
      if (!snap.ok()) return "after the replay, reading the tree fails: " + snap.status().ToString() + "\n";
      if (!(*snap == shown)) return "the replay shows another tree than the read-only open:\n" + Diff(shown, *snap);
    }
    auto vol = txn::Volume::Open(copy->Clone(), txn::VolumeOptions{});
    if (!vol.ok()) return "after the replay, the volume does not open: " + vol.status().ToString() + "\n";
    if ((*vol)->super().log_root.get() != 0) return "after the replay, log_root is still set\n";
    check::CheckResult cr = check::CheckVolume(**vol);
    if (!cr.clean()) {
      std::string out = "after the replay, ubtrfs check: " + std::to_string(cr.error_count) + " errors:\n";
      for (size_t i = 0; i < cr.errors.size() && i < 8; ++i) out += "  " + cr.errors[i] + "\n";
      return out;
    }
    std::string out;
    Totals& t = GlobalTotals();
    if (have_btrfs_ && replay_checks_ < 6) {
      ++replay_checks_;
      const std::string path = scratch_ + "/replayed.img";
      if (Status st = copy->SaveToFile(path); !st.ok()) return "cannot save: " + st.ToString() + "\n";
      ++t.btrfs_checks;
      std::string e = ubtrfs_test::BtrfsCheck(path);
      if (!e.empty()) out += "btrfs check after ubtrfs's replay: " + e.substr(0, 2000) + "\n";
    }
    if (kernel_ && kernel_checks_ < 3) {
      // The kernel's own replay of the crashed image, and btrfs check after.
      ++kernel_checks_;
      ++t.kernel_replays;
      const std::string path = scratch_ + "/kernel.img", mnt = scratch_ + "/kernel.mnt";
      if (Status st = img.SaveToFile(path); !st.ok()) return "cannot save: " + st.ToString() + "\n";
      mkdir(mnt.c_str(), 0755);
      ubtrfs_test::LoopMount m;
      if (std::string e = m.Mount(path, mnt, "noatime"); !e.empty()) return out + "the kernel does not mount it: " + e + "\n";
      for (const auto& [p, n] : shown) {
        if (n.type != 'f') continue;
        std::ifstream in(mnt + "/" + p, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (!in.good() && !in.eof()) {
          out += "the kernel's replay lacks /" + p + "\n";
        } else if (n.data && bytes != *n.data) {
          out += "the kernel's replay has other bytes in /" + p + "\n";
        }
      }
      for (const auto& entry : std::filesystem::recursive_directory_iterator(mnt)) {
        const std::string rel = entry.path().string().substr(mnt.size() + 1);
        if (!shown.count(rel)) out += "the kernel's replay has /" + rel + ", ubtrfs's does not\n";
      }
      if (std::string e = m.Unmount(); !e.empty()) return out + e + "\n";
      if (have_btrfs_) {
        std::string e = ubtrfs_test::BtrfsCheck(path);
        if (!e.empty()) out += "btrfs check after the kernel's replay: " + e.substr(0, 2000) + "\n";
      }
    }
    return out;
  }

  std::string Examine(const io::CrashImage& img, uint64_t lo, uint64_t hi, bool run_btrfs_check, size_t durable = 0,
                      size_t issued = 0) {
    Totals& t = GlobalTotals();
    std::string failure;
    // 1. Our checker.
    {
      txn::VolumeOptions vo;
      std::vector<std::pair<uint64_t, uint64_t>> reads;
      auto vol = txn::Volume::Open(std::make_unique<ReadLog>(img.Clone(), &reads), vo);
      if (!vol.ok()) {
        failure += "volume does not open: " + vol.status().ToString() + "\n";
      } else {
        check::CheckResult cr = check::CheckVolume(**vol);
        if (!cr.clean()) {
          failure += "ubtrfs check: " + std::to_string(cr.error_count) + " errors:\n";
          for (size_t i = 0; i < cr.errors.size() && i < 8; ++i) failure += "  " + cr.errors[i] + "\n";
        }
        // ... and both DUP copies of every tree block it visited agree.
        failure += CompareDupCopies(img, (*vol)->chunks(), reads, (*vol)->nodesize());
      }
    }
    // 2. Open through the library, without repair, and compare with the model.
    uint64_t gen = 0;
    {
      auto fs = OpenOnDevice(img.Clone(), OpenOptions{});
      if (!fs.ok()) {
        failure += "does not open: " + fs.status().ToString() + "\n";
      } else {
        bool log_replayed = false;
        for (const auto& w : (*fs)->Warnings()) {
          // An fsync's tree log, replayed in memory: the committed state
          // plus what was fsynced since (checked below, not against one
          // commit's model).
          if (w.find("tree log") != std::string::npos && w.find("replayed in memory") != std::string::npos) {
            log_replayed = true;
            continue;
          }
          failure += "opened with a warning: " + w + "\n";
        }
        gen = (*fs)->Info().generation;
        if (run_.fsyncs() > 0) {
          auto snap = Snapshot(**fs);
          if (!snap.ok()) {
            failure += "reading the tree fails: " + snap.status().ToString() + "\n";
          } else {
            failure += CheckFsynced(*snap, durable, issued);
            if (log_replayed) failure += ReplayWritable(img, *snap);
          }
          if (log_replayed) {
            ++GlobalTotals().log_replays;
            // (the replay in memory is a commit of its own: one generation more)
            if (gen < lo || gen > hi + 1) failure += "generation " + std::to_string(gen) + " outside [lo, hi + 1]\n";
            return failure;
          }
        }
        if (gen < lo || gen > hi) {
          failure += "generation " + std::to_string(gen) + " outside [" + std::to_string(lo) + ", " +
                     std::to_string(hi) + "] (last flushed / last issued superblock)\n";
        }
        auto it = run_.states().find(gen);
        auto snap = Snapshot(**fs);
        if (!snap.ok()) {
          failure += "reading the tree fails: " + snap.status().ToString() + "\n";
        } else if (it == run_.states().end()) {
          failure += "generation " + std::to_string(gen) + " is no commit of the workload\n";
        } else if (!(*snap == it->second)) {
          failure += "content differs from the model after commit " + std::to_string(gen) + ":\n" +
                     Diff(it->second, *snap);
        } else if (gen < hi) {
          ++t.older_state;
        }
      }
    }
    // 4. A subvolume deletion cut short resumes at a writable open: the drop
    // ends, no dead tree is left, nothing visible changes, the checker
    // passes.
    if (resume_drops_ && gen != 0) failure += ResumeDrops(img, gen);
    // 3. btrfs check on a sample.
    if (run_btrfs_check) {
      const std::string path = scratch_ + "/crash.img";
      Status st = img.SaveToFile(path);
      if (!st.ok()) return "cannot save the image for btrfs check: " + st.ToString();
      auto t0 = std::chrono::steady_clock::now();
      std::string out = ubtrfs_test::BtrfsCheck(path);
      t.btrfs_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++t.btrfs_checks;
      if (!out.empty()) failure += out.substr(0, 3000) + "\n";
    }
    return failure;
  }

  std::string ResumeDrops(const io::CrashImage& img, uint64_t gen) {
    auto copy = img.Clone();
    {
      OpenOptions o;
      o.writable = true;
      o.drop_blocks_per_commit = kDropBlocksPerCommit;
      auto fs = OpenOnDevice(io::NewUnownedDevice(copy.get()), o);
      if (!fs.ok()) return "does not open writable (resuming drops): " + fs.status().ToString() + "\n";
      auto it = run_.states().find(gen);
      auto snap = Snapshot(**fs);
      if (!snap.ok()) return "after resuming drops, reading the tree fails: " + snap.status().ToString() + "\n";
      if (it != run_.states().end() && !(*snap == it->second)) {
        return "after resuming drops, content differs from the model after commit " + std::to_string(gen) + ":\n" +
               Diff(it->second, *snap);
      }
    }
    auto vol = txn::Volume::Open(copy->Clone(), txn::VolumeOptions{});
    if (!vol.ok()) return "after resuming drops, the volume does not open: " + vol.status().ToString() + "\n";
    tree::Cursor c((*vol)->source(), (*vol)->root_tree());
    Status st = c.Seek(format::Key{format::kOrphanObjectid, format::kOrphanItemKey, 0});
    if (!st.ok()) return "after resuming drops, the root tree: " + st.ToString() + "\n";
    if (c.Valid() && c.key().objectid == format::kOrphanObjectid) {
      return "after resuming drops, tree " + std::to_string(c.key().offset) + " is still dead\n";
    }
    check::CheckResult cr = check::CheckVolume(**vol);
    if (cr.clean()) return "";
    std::string out = "after resuming drops, ubtrfs check: " + std::to_string(cr.error_count) + " errors:\n";
    for (size_t i = 0; i < cr.errors.size() && i < 8; ++i) out += "  " + cr.errors[i] + "\n";
    return out;
  }

  void Verify(const CrashPoint& p, bool run_btrfs_check) {
    Totals& t = GlobalTotals();
    ++t.points;
    ++t.by_mode[p.mode];
    const uint64_t lo = GenIssued(rep_.DurablePrefix(p.entries));
    uint64_t hi = GenIssued(p.entries);
    auto img = rep_.Materialize(p);
    ASSERT_TRUE(img.ok()) << img.status().ToString();
    std::string where = name_ + ": " + p.ToString();
    if ((*img)->torn_entry() != SIZE_MAX) {
      where += " torn entry " + std::to_string((*img)->torn_entry()) + " (" +
               std::to_string((*img)->torn_sectors().size()) + " sectors landed)";
    }
    std::string failure = Examine(**img, lo, hi, run_btrfs_check, rep_.DurablePrefix(p.entries), p.entries);
    if (!failure.empty()) {
      ++t.failures;
      ++failures_;
      const std::string keep = scratch_ + "/" + name_ + "-failed-" + std::to_string(failures_) + ".img";
      (void)(*img)->SaveToFile(keep);
      ADD_FAILURE() << where << " (allowed generations " << lo << ".." << hi << ", image saved as " << keep
                    << "):\n"
                    << failure;
    }
  }

  // The verifier's own test: a device that acknowledged a flush but lost a
  // tree block written before it (both DUP copies, or one) must be caught.
  // For every commit, each of its first few tree blocks is reverted in turn
  // in the image right after its superblock write; returns {tried, caught}.
  std::pair<int, int> LostWritesCaught(uint32_t nodesize) {
    const auto& log = run_.rec().log();
    io::CrashReplayer before(&run_.rec());
    int tried = 0, caught = 0;
    size_t commit_start = 0;  // entries of the previous commits
    for (size_t w : super_writes_) {
      const size_t flush = rep_.DurablePrefix(w);  // after the commit's tree blocks
      std::vector<size_t> blocks;
      for (size_t i = commit_start; i < flush; ++i) {
        if (log[i].kind == LogEntry::Kind::kWrite && log[i].data.size() == nodesize) blocks.push_back(i);
      }
      auto old = before.Materialize(CrashPoint{commit_start, CrashMode::kPrefix, 0});
      EXPECT_TRUE(old.ok());
      for (size_t k = 0; k < blocks.size() && k < 6 && old.ok(); ++k) {
        // Even k: every copy of the block is lost; odd k: only the last copy
        // (which only the DUP comparison can see).
        auto img = rep_.Materialize(CrashPoint{w + 1, CrashMode::kPrefix, 0});
        EXPECT_TRUE(img.ok());
        if (!img.ok()) break;
        const LogEntry& lost = log[blocks[k]];
        std::vector<size_t> copies;
        for (size_t i : blocks) {
          if (log[i].data == lost.data) copies.push_back(i);
        }
        if (k % 2 == 1) copies.erase(copies.begin(), copies.end() - 1);
        for (size_t i : copies) {
          std::vector<uint8_t> stale(nodesize);
          EXPECT_TRUE((*old)->ReadAt(log[i].offset, stale).ok());
          EXPECT_TRUE((*img)->WriteAt(log[i].offset, stale).ok());
        }
        const uint64_t gen = SuperGeneration(log[w]);
        ++tried;
        caught += !Examine(**img, gen, gen, false).empty();
      }
      commit_start = w + 1;
      while (commit_start < log.size() && log[commit_start].kind != LogEntry::Kind::kFlush) ++commit_start;
      commit_start = std::min(commit_start + 1, log.size());
    }
    return {tried, caught};
  }

  // Runs the plan over the whole log.
  void RunPlan(const Plan& plan, uint64_t seed) {
    const auto& log = run_.rec().log();
    const size_t n = log.size();
    std::mt19937_64 rng(seed);
    std::vector<size_t> points;
    if (plan.every_prefix) {
      for (size_t i = 0; i <= n; ++i) points.push_back(i);
    } else {
      std::set<size_t> s{0, n};
      // Around every superblock write, and a random sample of the rest.
      for (size_t w : super_writes_) {
        for (size_t d = 0; d <= 2 && w + d <= n; ++d) s.insert(w + d);
      }
      while (s.size() < plan.sample + super_writes_.size() * 3 && s.size() < n + 1) s.insert(rng() % (n + 1));
      points.assign(s.begin(), s.end());
    }
    int limit_failures = 20;
    for (size_t p : points) {
      // btrfs check right at superblock writes (before the primary, between
      // it and the mirror, after both) and on a random fraction elsewhere.
      const bool near_super = super_writes_.count(p) || (p > 0 && super_writes_.count(p - 1)) ||
                              (p > 1 && super_writes_.count(p - 2));
      const bool btrfs = have_btrfs_ && (near_super || std::uniform_real_distribution<>(0, 1)(rng) < plan.btrfs_fraction);
      if (near_super && btrfs) ++GlobalTotals().btrfs_check_super_points;
      Verify(CrashPoint{p, CrashMode::kPrefix, 0}, btrfs);
      const size_t durable = rep_.DurablePrefix(p);
      bool unflushed = false;
      for (size_t i = durable; i < p && !unflushed; ++i) unflushed = log[i].kind == LogEntry::Kind::kWrite;
      // The flush-boundary variants where they differ from the prefix: just
      // before a flush (the most unflushed writes) and at sampled points.
      const bool before_flush = p < n && log[p].kind == LogEntry::Kind::kFlush;
      if (unflushed && (before_flush || !plan.every_prefix)) {
        Verify(CrashPoint{p, CrashMode::kDropUnflushed, 0}, false);
        for (int s = 0; s < plan.subset_seeds; ++s) {
          Verify(CrashPoint{p, CrashMode::kSubset, rng()}, std::uniform_real_distribution<>(0, 1)(rng) < plan.btrfs_fraction);
        }
        for (int s = 0; s < plan.torn_seeds; ++s) {
          Verify(CrashPoint{p, CrashMode::kTorn, rng()}, std::uniform_real_distribution<>(0, 1)(rng) < plan.btrfs_fraction);
        }
      }
      if (::testing::Test::HasFatalFailure()) return;
      // This workload's own failures: another workload's must not cut its
      // run short or be reported as its.
      if (failures_ > 0 && --limit_failures <= 0) {
        ADD_FAILURE() << name_ << ": stopping after 20 crash points past the first failure";
        return;
      }
    }
  }

  void set_have_btrfs(bool b) { have_btrfs_ = b; }
  void set_resume_drops(bool b) { resume_drops_ = b; }
  uint64_t failures() const { return failures_; }

 private:
  const WorkloadRun& run_;
  io::CrashReplayer rep_;
  std::string scratch_, name_;
  std::vector<uint64_t> gen_issued_;
  std::set<size_t> super_writes_;
  bool have_btrfs_ = false;
  bool resume_drops_ = false;
  bool kernel_ = false;  // loop mounts work: the kernel replays a sample of the logs
  int replay_checks_ = 0, kernel_checks_ = 0;
  uint64_t failures_ = 0;  // crash points of this workload that failed
 public:
  void set_kernel(bool k) { kernel_ = k; }
};

class CrashTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    const Totals& t = GlobalTotals();
    if (t.workloads == 0) return;
    std::ostringstream s;
    s << "crash suite" << (Soak() ? " (soak)" : "") << ": " << t.workloads << " workloads, " << t.commits
      << " commits, " << t.log_entries << " logged writes and flushes; " << t.points << " crash points (";
    bool first = true;
    for (const auto& [m, c] : t.by_mode) {
      s << (first ? "" : ", ") << c << " " << io::CrashModeName(m);
      first = false;
    }
    s << "); " << t.older_state << " showed the previous commit; " << t.log_replays << " replayed a tree log ("
      << t.kernel_replays << " also by the kernel); btrfs check on " << t.btrfs_checks << " of them ("
      << t.btrfs_check_super_points << " at superblock writes, the rest a random sample), "
      << static_cast<int>(t.btrfs_seconds) << " s; " << t.failures << " failures; " << static_cast<int>(t.seconds)
      << " s in all\n";
    std::cout << s.str();
  }

  void SetUp() override {
    have_btrfs_ = !ubtrfs_test::FindProgram("btrfs").empty();
    if (!have_btrfs_) std::cout << "btrfs not installed: crash images are checked with ubtrfs only\n";
  }

  // Runs a workload, then its crash points.
  void RunWorkload(const std::string& name, const std::function<void(WorkloadRun&)>& workload, const Plan& plan,
                   uint64_t seed, uint32_t nodesize = 16384) {
    auto t0 = std::chrono::steady_clock::now();
    WorkloadRun run(seed, nodesize);
    run.set_node_cache_bytes(node_cache_bytes_);
    run.set_data_bytes(data_bytes_);
    run.Start();
    ASSERT_FALSE(HasFatalFailure());
    workload(run);
    ASSERT_FALSE(HasFatalFailure());
    run.Finish();
    ASSERT_FALSE(HasFatalFailure());
    Totals& t = GlobalTotals();
    const uint64_t before = t.points, checks = t.btrfs_checks;
    CrashVerifier v(run, scratch_.path(), name);
    v.set_have_btrfs(have_btrfs_);
    v.set_resume_drops(resume_drops_);
    v.set_kernel(kernel_);
    v.RunPlan(plan, seed ^ 0x5eed);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++t.workloads;
    t.commits += static_cast<uint64_t>(run.commits());
    t.log_entries += run.rec().log().size();
    t.seconds += secs;
    std::cout << name << ": " << run.commits() << " commits, " << run.rec().log().size() << " log entries ("
              << (run.rec().bytes_logged() >> 10) << " KiB written), " << (t.points - before) << " crash points, "
              << (t.btrfs_checks - checks) << " btrfs checks, " << v.failures() << " failures, "
              << static_cast<int>(secs) << " s\n";
  }

  bool have_btrfs_ = false;
  bool resume_drops_ = false;
  bool kernel_ = false;
  size_t node_cache_bytes_ = 0;  // 0: the library's default
  uint64_t data_bytes_ = 0;      // mkfs's data chunk; 0: its default
  TempDir scratch_{"ubtrfs-crash"};
};

Plan ShortPlan() {
  Plan p;
  p.every_prefix = true;
  return p;
}

Plan LongPlan(size_t sample) {
  Plan p;
  p.every_prefix = false;
  p.sample = sample;
  p.subset_seeds = 1;
  p.torn_seeds = 1;
  return p;
}

TEST_F(CrashTest, NamespaceChurn) {
  const uint64_t seed = BaseSeed() * 1000 + 1;
  RunWorkload("churn", [&](WorkloadRun& r) { ChurnWorkload(r, Soak() ? 400 : 80); }, ShortPlan(), seed);
}

TEST_F(CrashTest, CommitsBehindTheNextTransaction) {
  const uint64_t seed = BaseSeed() * 1000 + 12;
  // Four blocks: the next transaction's reads of the held commit's blocks
  // miss the cache and must find them unwritten, not read the device.
  node_cache_bytes_ = 64 << 10;
  RunWorkload("commit-behind", [&](WorkloadRun& r) { CommitBehindWorkload(r, Soak() ? 60 : 12); }, ShortPlan(), seed);
}

TEST_F(CrashTest, EmptiedGroupsAreDeletedBehindTheNextTransaction) {
  const uint64_t seed = BaseSeed() * 1000 + 13;
  // The crash points around every superblock write are always taken: the
  // one just before the held commit's own has the next transaction's data
  // written and the deleted chunks' space still named by the chunk tree.
  data_bytes_ = 4 << 20;
  RunWorkload("emptied-groups", [&](WorkloadRun& r) { EmptiedGroupsWorkload(r, Soak() ? 8 : 2); },
              LongPlan(Soak() ? 1500 : 30), seed);
}

TEST_F(CrashTest, ExtentsMovedUnderSnapshots) {
  const uint64_t seed = BaseSeed() * 1000 + 14;
  RunWorkload("relocation", [&](WorkloadRun& r) { RelocationWorkload(r, Soak() ? 6 : 2); },
              LongPlan(Soak() ? 2000 : 150), seed, 4096);
}

TEST_F(CrashTest, AppendsWithFsync) {
  const uint64_t seed = BaseSeed() * 1000 + 2;
  RunWorkload("appends", [&](WorkloadRun& r) { AppendWorkload(r, Soak() ? 200 : 40); }, ShortPlan(), seed);
}

TEST_F(CrashTest, FsyncThroughTheTreeLog) {
  const uint64_t seed = BaseSeed() * 1000 + 9;
  std::string why;
  kernel_ = ubtrfs_test::LoopMountsAvailable(&why);
  if (!kernel_) std::cout << "loop mounts unavailable (" << why << "): the kernel replays no log here\n";
  RunWorkload("fsync-log", [&](WorkloadRun& r) { FsyncLogWorkload(r, Soak() ? 200 : 40); }, ShortPlan(), seed);
}

TEST_F(CrashTest, RenameOverExisting) {
  const uint64_t seed = BaseSeed() * 1000 + 3;
  RunWorkload("rename-over", [&](WorkloadRun& r) { RenameOverWorkload(r, Soak() ? 120 : 25); }, ShortPlan(), seed);
}

TEST_F(CrashTest, TreesCreatedAndDeleted) {
  const uint64_t seed = BaseSeed() * 1000 + 4;
  RunWorkload("trees", [&](WorkloadRun& r) { TreesWorkload(r, Soak() ? 30 : 8); }, Soak() ? ShortPlan() : LongPlan(600), seed);
}

TEST_F(CrashTest, SnapshotsReflinksAndSubvolumeDrops) {
  const uint64_t seed = BaseSeed() * 1000 + 6;
  resume_drops_ = true;
  RunWorkload("subvolumes", [&](WorkloadRun& r) { SubvolumesWorkload(r, Soak() ? 12 : 5); },
              Soak() ? ShortPlan() : LongPlan(500), seed, 4096);
}

TEST_F(CrashTest, ImportGeneratedTrees) {
  const uint64_t seed = BaseSeed() * 1000 + 5;
  TempDir host("ubtrfs-crash-src");
  RunWorkload("import", [&](WorkloadRun& r) { ImportWorkload(r, host.path(), Soak() ? 6 : 3, Soak() ? 300 : 80); },
              LongPlan(Soak() ? 3000 : 600), seed);
}

// A primary superblock torn at every sector boundary (what the suite above
// never produces, as btrfs assumes 4 KiB superblock writes are atomic): the
// kernel and btrfs check refuse such an image; ubtrfs opens it from the copy
// at 64 MiB -- saying so -- at the previous commit, whose content is intact,
// and its checker reports the unusable primary.
TEST_F(CrashTest, TornPrimarySuperblock) {
  WorkloadRun run(BaseSeed() * 1000 + 7);
  run.Start();
  AppendWorkload(run, 4);
  run.Finish();
  ASSERT_FALSE(HasFatalFailure());
  const auto& log = run.rec().log();
  io::CrashReplayer rep(&run.rec());
  int tried = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    const uint64_t gen = SuperGeneration(log[i]);
    if (gen == 0) continue;
    for (size_t sectors = 1; sectors < format::kSuperInfoSize / io::kTornSectorSize; ++sectors) {
      auto img = rep.Materialize(CrashPoint{i, CrashMode::kPrefix, 0});
      ASSERT_TRUE(img.ok());
      const auto part = std::span<const uint8_t>(log[i].data).first(sectors * io::kTornSectorSize);
      ASSERT_TRUE((*img)->WriteAt(log[i].offset, part).ok());
      std::vector<uint8_t> now(format::kSuperInfoSize);
      ASSERT_TRUE((*img)->ReadAt(log[i].offset, now).ok());
      auto fs = OpenOnDevice((*img)->Clone(), OpenOptions{});
      ASSERT_TRUE(fs.ok()) << fs.status().ToString();
      if (now == log[i].data) {
        // The sectors that did not land held the same bytes (the unused tail).
        EXPECT_TRUE((*fs)->Warnings().empty());
        EXPECT_EQ((*fs)->Info().generation, gen);
        continue;
      }
      ASSERT_EQ((*fs)->Warnings().size(), 1u) << "superblock write at entry " << i << " (generation " << gen
                                              << "), " << sectors << " sectors of it landed";
      EXPECT_NE((*fs)->Warnings()[0].find("using superblock copy 1"), std::string::npos) << (*fs)->Warnings()[0];
      EXPECT_EQ((*fs)->Info().generation, gen - 1);
      auto snap = Snapshot(**fs);
      ASSERT_TRUE(snap.ok()) << snap.status().ToString();
      EXPECT_TRUE(*snap == run.states().at(gen - 1)) << Diff(run.states().at(gen - 1), *snap);
      auto vol = txn::Volume::Open((*img)->Clone(), txn::VolumeOptions{});
      ASSERT_TRUE(vol.ok());
      check::CheckResult cr = check::CheckVolume(**vol);
      ASSERT_EQ(cr.error_count, 1u);
      EXPECT_NE(cr.errors[0].find("primary"), std::string::npos) << cr.errors[0];
      ++tried;
    }
  }
  EXPECT_GE(tried, 5 * 5);
  std::cout << tried << " torn primary superblocks: opened from the copy at the previous commit\n";
}

// The verifier catches what it is there to catch: an image whose last
// superblock points at a tree block that never reached the disk (both of its
// DUP copies, or only the second, which reads never look at).
TEST_F(CrashTest, VerifierCatchesALostFlushedWrite) {
  WorkloadRun run(BaseSeed() * 1000 + 8);
  run.Start();
  ChurnWorkload(run, 30);
  run.Finish();
  ASSERT_FALSE(HasFatalFailure());
  CrashVerifier v(run, scratch_.path(), "lost-write");
  auto [tried, caught] = v.LostWritesCaught(16384);
  EXPECT_GT(tried, 20);
  EXPECT_EQ(caught, tried) << "lost tree block writes that went unnoticed";
  std::cout << caught << " of " << tried << " lost tree block writes caught\n";
}

// A long mixed run: every workload kind in one filesystem, sampled.
TEST_F(CrashTest, LongMixed) {
  const uint64_t seed = BaseSeed() * 1000 + 6;
  RunWorkload("long-mixed",
              [&](WorkloadRun& r) {
                for (int round = 0; round < (Soak() ? 8 : 2) && !HasFatalFailure(); ++round) {
                  ChurnWorkload(r, 60);
                  TreesWorkload(r, 2);
                  for (int i = 0; i < 10 && !HasFatalFailure(); ++i) {
                    const std::string f = r.Pick('f');
                    if (!f.empty()) r.WriteAt(f, r.model().at(f).data->size(), r.Bytes(1 + r.rng()() % 30000));
                    r.Commit();
                  }
                }
              },
              LongPlan(Soak() ? 5000 : 800), seed);
}

}  // namespace
