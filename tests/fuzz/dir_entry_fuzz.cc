// libFuzzer target: hostile directory entries (issue 23). A small valid
// image is built once (files, directories, a hard link, symlinks pointing at
// a canary directory outside the copy's destination); each input edits the
// DIR_ITEM / DIR_INDEX items of its fs tree leaf -- names (including "..",
// "/", NUL and the names of other entries), name lengths, types, locations
// -- recomputes the leaf's checksum, and then:
//   - ReadDir of every directory never yields an invalid or repeated name;
//   - ExportTree (the copy behind `ubtrfs cp IMAGE:/ DEST`) into a scratch
//     destination creates nothing outside it and writes nothing through a
//     symlink: the sandbox holds the destination and the untouched canary,
//     nothing else.
//
// Input: records of [u8 entry, u8 op, u8 len, len bytes], applied in order.
// No seed corpus is needed: an empty input is the clean image.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fs/dir_names.h"
#include "fuzz_image.h"
#include "txn/mkfs.h"
#include "txn/volume.h"
#include "ubtrfs/export.h"

namespace {

namespace fmtd = ubtrfs::format;
using ubtrfs_fuzz::Pages;
using ubtrfs_fuzz::SparseDevice;

constexpr uint32_t kNodeSize = 16384;  // the whole fs tree fits one leaf

struct Base {
  std::string top;      // mkdtemp dir: holds only sandbox/
  std::string sandbox;  // holds dest/ (made and removed per run) and canary/
  std::string canary;
  std::shared_ptr<Pages> pages;
  std::vector<uint64_t> leaf_copies;  // physical offsets of the fs tree leaf
  uint16_t csum_type = 0;
};

#define BASE_CHECK(cond)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "dir_entry_fuzz: setup failed: %s\n", #cond); \
      std::abort();                                                      \
    }                                                                    \
  } while (0)

Base MakeBase() {
  Base b;
  // tmpfs where there is one: each run makes and removes a small tree.
  struct stat shm;
  char tmpl[64];
  std::snprintf(tmpl, sizeof tmpl, "%s/ubtrfs-dir-fuzz-XXXXXX",
                ::stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) && ::access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                                                                                                       : "/tmp");
  BASE_CHECK(::mkdtemp(tmpl) != nullptr);
  b.top = tmpl;
  b.sandbox = b.top + "/sandbox";
  b.canary = b.sandbox + "/canary";
  BASE_CHECK(::mkdir(b.sandbox.c_str(), 0755) == 0);
  BASE_CHECK(::mkdir(b.canary.c_str(), 0755) == 0);

  b.pages = std::make_shared<Pages>();
  b.pages->size = ubtrfs::txn::MkfsMinBytes(kNodeSize);
  {
    SparseDevice dev(b.pages);
    ubtrfs::txn::MkfsOptions mo;
    mo.nodesize = kNodeSize;
    mo.time_sec = 1700000000;
    BASE_CHECK(ubtrfs::txn::MakeFilesystem(&dev, mo).ok());
  }
  {
    ubtrfs::OpenOptions o;
    o.writable = true;
    auto fs = ubtrfs::OpenOnDevice(std::make_unique<SparseDevice>(b.pages), o);
    BASE_CHECK(fs.ok());
    auto& f = **fs;
    const ubtrfs::InodeId root = f.Root();
    ubtrfs::NewInode file{.mode = 0644};
    ubtrfs::NewInode dir{.mode = 0755};
    auto d1 = f.Mkdir(root, "d1", dir);
    auto d2 = f.Mkdir(root, "d2", dir);
    BASE_CHECK(d1.ok() && d2.ok());
    auto sub = f.Mkdir(*d2, "sub", dir);
    BASE_CHECK(sub.ok());
    for (const auto& [parent, name] : std::vector<std::pair<ubtrfs::InodeId, std::string>>{
             {root, "f1"}, {root, "f2"}, {*d1, "g1"}, {*d1, "g2"}, {*sub, "h1"}}) {
      auto id = f.Create(parent, name, file);
      BASE_CHECK(id.ok());
      const std::string data = "contents of " + name + "\n";
      BASE_CHECK(f.Write(*id, 0, std::span(reinterpret_cast<const uint8_t*>(data.data()), data.size())).ok());
    }
    auto f1 = f.LookupChild(root, "f1");
    BASE_CHECK(f1.ok() && f.Link(*f1, *d1, "f1link").ok());
    // Symlinks an attacker would plant: at the canary (absolute), and up.
    BASE_CHECK(f.Symlink(root, "s1", b.canary, file).ok());
    BASE_CHECK(f.Symlink(*d1, "s2", "..", file).ok());
    BASE_CHECK(f.Symlink(*d2, "s3", "../../..", file).ok());
    BASE_CHECK(f.Commit().ok());
  }
  auto vol = ubtrfs::txn::Volume::Open(std::make_unique<SparseDevice>(b.pages), ubtrfs::txn::VolumeOptions{});
  BASE_CHECK(vol.ok());
  auto fsr = (*vol)->FindRoot(fmtd::kFsTreeObjectid);
  BASE_CHECK(fsr.ok() && fsr->ref.level == 0);  // the whole fs tree in one leaf
  auto copies = (*vol)->chunks().MapPhysical(fsr->ref.bytenr, kNodeSize);
  BASE_CHECK(copies.ok() && !copies->empty());
  b.leaf_copies = *copies;
  b.csum_type = (*vol)->csum_type();
  return b;
}

std::string g_top;  // removed at exit

// Removes a tree made by the copy, without following symlinks.
void RemoveAt(int dfd, const char* name);

void RemoveTop() {
  if (g_top.empty()) return;
  const size_t slash = g_top.find_last_of('/');
  int fd = ::open(g_top.substr(0, slash).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    RemoveAt(fd, g_top.substr(slash + 1).c_str());
    ::close(fd);
  }
}

Base& TheBase() {
  static Base b = [] {
    Base base = MakeBase();
    g_top = base.top;
    std::atexit(RemoveTop);
    return base;
  }();
  return b;
}

fmtd::Header& Hdr(std::vector<uint8_t>& blk) { return *reinterpret_cast<fmtd::Header*>(blk.data()); }
fmtd::Item* Items(std::vector<uint8_t>& blk) { return reinterpret_cast<fmtd::Item*>(blk.data() + sizeof(fmtd::Header)); }
uint8_t* Body(std::vector<uint8_t>& blk) { return blk.data() + sizeof(fmtd::Header); }

// Changes the size of item `slot` by `delta` bytes at the end of its data
// (growing needs free space in the leaf). Its data and that of every later
// item move by -delta, so the leaf stays packed from the block's end.
bool ResizeItem(std::vector<uint8_t>& blk, int slot, int delta) {
  fmtd::Item* it = Items(blk);
  const int n = static_cast<int>(Hdr(blk).nritems.get());
  const int64_t size = it[slot].size.get(), off = it[slot].offset.get();
  const int64_t data_end = it[n - 1].offset.get();  // the lowest data byte
  const int64_t items_end = static_cast<int64_t>(sizeof(fmtd::Item)) * n;
  if (size + delta < 0 || data_end - delta < items_end) return false;
  const int64_t kept = std::min<int64_t>(size, size + delta);
  std::memmove(Body(blk) + data_end - delta, Body(blk) + data_end, static_cast<size_t>(off + kept - data_end));
  if (delta > 0) std::memset(Body(blk) + off + size - delta, 0, static_cast<size_t>(delta));
  it[slot].size.set(static_cast<uint32_t>(size + delta));
  for (int i = slot; i < n; ++i) it[i].offset.set(static_cast<uint32_t>(it[i].offset.get() - delta));
  return true;
}

const char* const kNames[] = {"..", ".", "/", "a/b", "../../x", "f1", "d1", "s1", "d2", "sub", "canary", "..."};

void ApplyEdits(std::vector<uint8_t>& blk, const uint8_t* data, size_t size) {
  std::vector<int> dir_slots;
  const int n = static_cast<int>(Hdr(blk).nritems.get());
  for (int i = 0; i < n; ++i) {
    const uint8_t t = Items(blk)[i].key.type;
    if (t == fmtd::kDirItemKey || t == fmtd::kDirIndexKey) dir_slots.push_back(i);
  }
  if (dir_slots.empty()) return;
  size_t pos = 0;
  while (pos + 3 <= size) {
    const int slot = dir_slots[data[pos] % dir_slots.size()];
    const uint8_t op = data[pos + 1];
    const size_t len = std::min<size_t>(data[pos + 2], size - pos - 3);
    const uint8_t* arg = data + pos + 3;
    pos += 3 + len;
    fmtd::Item& item = Items(blk)[slot];
    if (item.size.get() < sizeof(fmtd::DirItem)) continue;
    auto* di = reinterpret_cast<fmtd::DirItem*>(Body(blk) + item.offset.get());
    uint8_t* name = reinterpret_cast<uint8_t*>(di) + sizeof(fmtd::DirItem);
    const size_t room = item.size.get() - sizeof(fmtd::DirItem);
    const size_t nl = std::min<size_t>(di->name_len.get(), room);
    switch (op % 6) {
      case 0:  // overwrite name bytes at an offset
        if (len >= 1 && nl > 0) {
          const size_t at = arg[0] % nl;
          std::memcpy(name + at, arg + 1, std::min(len - 1, nl - at));
        }
        break;
      case 1:  // file type
        if (len >= 1) di->type = arg[0];
        break;
      case 2:  // location: another inode (or anything)
        if (len >= 2) {
          const uint64_t ino = 256 + arg[0] % 32;
          fmtd::Key{ino, arg[1] % 4 == 0 ? fmtd::kRootItemKey : fmtd::kInodeItemKey, 0}.To(&di->location);
        }
        break;
      case 3:  // name_len, data_len (structure damage)
        if (len >= 2) {
          di->name_len.set(static_cast<uint16_t>(arg[0] | (arg[1] & 1) << 8));
          if (len >= 3) di->data_len.set(arg[2] % 4);
        }
        break;
      case 4:    // a canned name, resizing the item to fit it
      case 5: {  // the name of another entry
        std::string nn;
        if (op % 6 == 4) {
          nn = len >= 1 ? kNames[arg[0] % (sizeof kNames / sizeof kNames[0])] : "..";
          if (len >= 2 && (arg[1] & 1)) nn.push_back('\0');
        } else if (len >= 1) {
          const int other = dir_slots[arg[0] % dir_slots.size()];
          fmtd::Item& o = Items(blk)[other];
          if (o.size.get() < sizeof(fmtd::DirItem)) break;
          const auto* odi = reinterpret_cast<const fmtd::DirItem*>(Body(blk) + o.offset.get());
          const size_t onl = std::min<size_t>(odi->name_len.get(), o.size.get() - sizeof(fmtd::DirItem));
          nn.assign(reinterpret_cast<const char*>(odi) + sizeof(fmtd::DirItem), onl);
        }
        if (nn.empty() || di->data_len.get() != 0 || di->name_len.get() != room) break;
        if (!ResizeItem(blk, slot, static_cast<int>(nn.size()) - static_cast<int>(room))) break;
        // The item may have moved.
        auto* di2 = reinterpret_cast<fmtd::DirItem*>(Body(blk) + Items(blk)[slot].offset.get());
        di2->name_len.set(static_cast<uint16_t>(nn.size()));
        std::memcpy(reinterpret_cast<uint8_t*>(di2) + sizeof(fmtd::DirItem), nn.data(), nn.size());
        break;
      }
    }
  }
}

void RemoveAt(int dfd, const char* name) {
  struct stat s;
  if (::fstatat(dfd, name, &s, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISDIR(s.st_mode)) {
    ::fchmodat(dfd, name, 0700, 0);
    int fd = ::openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      DIR* d = ::fdopendir(fd);
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
      }
      for (const auto& n : names) RemoveAt(::dirfd(d), n.c_str());
      ::closedir(d);
    }
    ::unlinkat(dfd, name, AT_REMOVEDIR);
  } else {
    ::unlinkat(dfd, name, 0);
  }
}

std::set<std::string> Names(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.insert(e->d_name);
  }
  ::closedir(d);
  return out;
}

// Every directory reachable by ReadDir: no invalid or repeated names.
void CheckListings(ubtrfs::Filesystem& fs, ubtrfs::InodeId dir, int depth) {
  if (depth > 8) return;
  auto entries = fs.ReadDir(dir);
  if (!entries.ok()) return ubtrfs_fuzz::CheckError(entries.status());
  std::set<std::string> seen;
  for (const auto& e : *entries) {
    FUZZ_CHECK(ubtrfs::fsimpl::InvalidNameReason(e.name) == nullptr);
    FUZZ_CHECK(seen.insert(e.name).second);
    if (e.type == DT_DIR && !(e.id == dir)) CheckListings(fs, e.id, depth + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Base& base = TheBase();
  auto pages = std::make_shared<Pages>(*base.pages);
  std::vector<uint8_t> blk(kNodeSize);
  pages->Read(base.leaf_copies[0], blk);
  ApplyEdits(blk, data, size);
  auto sum = fmtd::ComputeCsum(base.csum_type, std::span<const uint8_t>(blk).subspan(fmtd::kCsumSize));
  std::memcpy(blk.data(), sum.data(), fmtd::kCsumSize);
  for (uint64_t at : base.leaf_copies) pages->Write(at, blk);

  ubtrfs::OpenOptions o;
  o.node_cache_bytes = 1 << 20;
  auto fs = ubtrfs::OpenOnDevice(std::make_unique<SparseDevice>(pages), o);
  if (!fs.ok()) {
    ubtrfs_fuzz::CheckError(fs.status());
    return 0;
  }
  CheckListings(**fs, (*fs)->Root(), 0);

  const std::string dest = base.sandbox + "/dest";
  ubtrfs::ExportOptions eo;
  eo.privileged = false;
  eo.xattrs = false;
  ubtrfs::ExportReport report;
  (void)ubtrfs::ExportTree(**fs, (*fs)->Root(), "fuzz:/", dest, eo, &report);

  // Nothing outside the destination: the sandbox holds dest and the empty
  // canary, its parent only the sandbox.
  const std::set<std::string> top = Names(base.top), sandbox = Names(base.sandbox), canary = Names(base.canary);
  FUZZ_CHECK(top == std::set<std::string>{"sandbox"});
  FUZZ_CHECK(canary.empty());
  for (const auto& n : sandbox) FUZZ_CHECK(n == "dest" || n == "canary");
  int sfd = ::open(base.sandbox.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  FUZZ_CHECK(sfd >= 0);
  RemoveAt(sfd, "dest");
  ::close(sfd);
  return 0;
}
