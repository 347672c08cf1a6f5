#include "support/tree_gen.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include <fmt/core.h>

namespace ubtrfs_test {

namespace {

// ---------------------------------------------------------------- crc32c ---

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : (c >> 1);
    t[i] = c;
  }
  return t;
}

uint32_t Crc32cRaw(uint32_t crc, const void* data, size_t len) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < len; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

// ------------------------------------------------------------------- rng ---

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed ^ 0x9E3779B97F4A7C15ull) {}
  uint64_t Next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t Below(uint64_t n) { return n == 0 ? 0 : Next() % n; }
  uint64_t Range(uint64_t lo, uint64_t hi) { return lo + Below(hi - lo + 1); }  // inclusive
  bool Percent(unsigned p) { return Below(100) < p; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) { return v[Below(v.size())]; }

 private:
  uint64_t s_;
};

uint64_t Fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ (seed * 0x100000001b3ull);
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

[[noreturn]] void Fail(const std::string& what, const std::string& path, int err = errno) {
  throw std::runtime_error(fmt::format("GenerateTree: {} {}: {}", what, path, strerror(err)));
}

struct Pending {
  std::string rel;
  mode_t mode = 0;
  bool is_symlink = false;
  bool chown = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

class Generator {
 public:
  Generator(const std::string& root, uint64_t seed, const TreeGenOptions& o)
      : root_(root), seed_(seed), rng_(seed), o_(o), is_root_(geteuid() == 0) {}

  TreeGenStats Run();

 private:
  std::string Abs(const std::string& rel) const { return rel.empty() ? root_ : root_ + "/" + rel; }
  static std::string Join(const std::string& dir, const std::string& name) {
    return dir.empty() ? name : dir + "/" + name;
  }

  // Creation primitives; each registers the entry for the final mode/owner pass.
  void MkDir(const std::string& rel, mode_t mode);
  void WriteFile(const std::string& rel, mode_t mode, const std::vector<std::pair<uint64_t, uint64_t>>& data,
                 uint64_t size);  // data = (offset, length) runs; size = final size
  void SmallFile(const std::string& rel, uint64_t size) { WriteFile(rel, RandomFileMode(), {{0, size}}, size); }
  void Symlink(const std::string& rel, const std::string& target);
  void HardLink(const std::string& existing, const std::string& rel);
  void Fifo(const std::string& rel);
  void Device(const std::string& rel, mode_t type, dev_t dev);
  void Socket(const std::string& rel);
  bool SetXattr(const std::string& rel, const std::string& name, const std::string& value);
  void RandomXattrs(const std::string& rel, bool is_symlink);

  void FillData(uint8_t* p, size_t n, uint64_t key);
  std::string RandomBytes(size_t n, bool printable);
  std::string RandomName(size_t min_len, size_t max_len);
  std::string UniqueName(const std::string& dir, size_t min_len, size_t max_len);
  bool Reserve(const std::string& dir, const std::string& name);
  mode_t RandomFileMode();
  mode_t RandomDirMode();
  void MaybeOwner(Pending& p);
  std::string RandomSymlinkTarget(const std::string& rel);

  void BuildSizes();
  void BuildWide();
  void BuildDeep();
  void BuildOdd();
  void BuildBig();
  void BuildLinks();
  void BuildCollisions();
  void BuildSpecial();
  void BuildAcl();
  void BuildRandom(size_t count);
  void FinalAttrs();
  void SetTimes(const std::string& rel, bool is_dir);

  std::string root_;
  uint64_t seed_;
  Rng rng_;
  TreeGenOptions o_;
  bool is_root_;
  TreeGenStats stats_;
  size_t created_ = 0;
  std::vector<Pending> pending_;
  std::map<std::string, std::set<std::string>> names_;  // dir -> names used
  std::vector<std::string> dirs_;                       // dirs open for random entries
  std::vector<std::string> files_;                      // regular files (link targets)
  std::map<std::string, struct timespec> fixed_times_;
  std::vector<uint8_t> buf_;
};

std::string Generator::RandomBytes(size_t n, bool printable) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = rng_.Next();
    s[i] = printable ? static_cast<char>(0x21 + r % 94) : static_cast<char>(r & 0xff);
  }
  return s;
}

void Generator::FillData(uint8_t* p, size_t n, uint64_t key) {
  // Mix of patterns: pseudo-random, text-like (compressible), and zero runs.
  uint64_t x = key * 0x9E3779B97F4A7C15ull + 1;
  int pattern = static_cast<int>(key % 5);
  for (size_t i = 0; i < n;) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (pattern == 0 && (i & 0xffff) < 0x800) {  // zero run inside data
      p[i++] = 0;
      continue;
    }
    if (pattern == 1) {  // text-ish
      p[i] = static_cast<uint8_t>("the quick brown fox jumps over the lazy dog\n"[(i + (x & 3)) % 44]);
      ++i;
      continue;
    }
    size_t k = std::min<size_t>(8, n - i);
    memcpy(p + i, &x, k);
    i += k;
  }
}

std::string Generator::RandomName(size_t min_len, size_t max_len) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.";
  size_t len = rng_.Range(min_len, max_len);
  std::string s;
  for (size_t i = 0; i < len; ++i) {
    uint64_t r = rng_.Below(100);
    if (r < 2 && i > 0) s += ' ';
    else if (r < 3) s += "\xc3\xa9";  // é
    else s += kChars[rng_.Below(sizeof(kChars) - 1)];
  }
  if (s == "." || s == "..") s += "x";
  if (s.size() > 255) s.resize(255);
  return s;
}

bool Generator::Reserve(const std::string& dir, const std::string& name) {
  return names_[dir].insert(name).second;
}

std::string Generator::UniqueName(const std::string& dir, size_t min_len, size_t max_len) {
  for (;;) {
    std::string n = RandomName(min_len, max_len);
    if (Reserve(dir, n)) return n;
  }
}

mode_t Generator::RandomFileMode() {
  static const std::vector<mode_t> common = {0644, 0644, 0644, 0600, 0755, 0640, 0444, 0400, 0700, 0664, 0777};
  static const std::vector<mode_t> special = {04755, 02755, 06755, 01644, 07777, 02644, 04700};
  if (o_.special_modes && rng_.Percent(4)) return rng_.Pick(special);
  return rng_.Pick(common);
}

mode_t Generator::RandomDirMode() {
  static const std::vector<mode_t> common = {0755, 0755, 0755, 0700, 0750, 0775, 0711, 0555, 0777};
  static const std::vector<mode_t> special = {01777, 02775, 03777, 07755, 02755, 04755};
  if (o_.special_modes && rng_.Percent(8)) return rng_.Pick(special);
  return rng_.Pick(common);
}

void Generator::MaybeOwner(Pending& p) {
  static const std::vector<uint32_t> ids = {0, 1, 1000, 1001, 65534, 100000, 2147483647};
  if (!o_.owners || !is_root_ || !rng_.Percent(25)) return;
  p.chown = true;
  p.uid = rng_.Pick(ids);
  p.gid = rng_.Pick(ids);
}

void Generator::MkDir(const std::string& rel, mode_t mode) {
  if (mkdir(Abs(rel).c_str(), 0700) != 0) Fail("mkdir", Abs(rel));
  Pending p{rel, mode};
  MaybeOwner(p);
  pending_.push_back(p);
  ++stats_.dirs;
  ++created_;
}

void Generator::WriteFile(const std::string& rel, mode_t mode,
                          const std::vector<std::pair<uint64_t, uint64_t>>& data, uint64_t size) {
  std::string path = Abs(rel);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) Fail("create", path);
  uint64_t key = Fnv1a(rel, seed_);
  for (const auto& [off, len] : data) {
    if (buf_.size() < len) buf_.resize(len);
    FillData(buf_.data(), len, key++);
    uint64_t done = 0;
    while (done < len) {
      ssize_t n = pwrite(fd, buf_.data() + done, len - done, static_cast<off_t>(off + done));
      if (n <= 0) {
        int e = errno;
        close(fd);
        Fail("write", path, e);
      }
      done += n;
    }
    stats_.data_bytes += len;
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    Fail("ftruncate", path, e);
  }
  close(fd);
  Pending p{rel, mode};
  MaybeOwner(p);
  pending_.push_back(p);
  files_.push_back(rel);
  stats_.apparent_bytes += size;
  ++stats_.files;
  ++created_;
  if (o_.xattrs && rng_.Percent(12)) RandomXattrs(rel, false);
}

void Generator::Symlink(const std::string& rel, const std::string& target) {
  if (symlink(target.c_str(), Abs(rel).c_str()) != 0) Fail("symlink", Abs(rel));
  Pending p{rel, 0777, true};
  MaybeOwner(p);
  pending_.push_back(p);
  ++stats_.symlinks;
  ++created_;
  if (o_.xattrs && is_root_ && rng_.Percent(15)) RandomXattrs(rel, true);
}

void Generator::HardLink(const std::string& existing, const std::string& rel) {
  if (linkat(AT_FDCWD, Abs(existing).c_str(), AT_FDCWD, Abs(rel).c_str(), 0) != 0) Fail("link", Abs(rel));
  ++stats_.hard_links;
  ++created_;
}

void Generator::Fifo(const std::string& rel) {
  if (mkfifo(Abs(rel).c_str(), 0600) != 0) Fail("mkfifo", Abs(rel));
  Pending p{rel, static_cast<mode_t>(rng_.Percent(50) ? 0644 : 0600)};
  MaybeOwner(p);
  pending_.push_back(p);
  ++stats_.fifos;
  ++created_;
}

void Generator::Device(const std::string& rel, mode_t type, dev_t dev) {
  if (mknod(Abs(rel).c_str(), type | 0600, dev) != 0) Fail("mknod", Abs(rel));
  Pending p{rel, 0660};
  MaybeOwner(p);
  pending_.push_back(p);
  ++stats_.devices;
  ++created_;
}

void Generator::Socket(const std::string& rel) {
  if (mknod(Abs(rel).c_str(), S_IFSOCK | 0600, 0) != 0) Fail("mknod(socket)", Abs(rel));
  pending_.push_back(Pending{rel, 0755});
  ++stats_.devices;
  ++created_;
}

bool Generator::SetXattr(const std::string& rel, const std::string& name, const std::string& value) {
  if (lsetxattr(Abs(rel).c_str(), name.c_str(), value.data(), value.size(), 0) != 0) {
    if (errno == ENOTSUP || errno == EPERM || errno == ENOSPC || errno == E2BIG || errno == ERANGE ||
        errno == EACCES || errno == EINVAL) {
      ++stats_.xattrs_skipped;
      return false;
    }
    Fail("setxattr " + name, Abs(rel));
  }
  ++stats_.xattrs;
  return true;
}

void Generator::RandomXattrs(const std::string& rel, bool is_symlink) {
  // user.* cannot be set on symlinks (or fifos/devices); trusted.* can (root).
  const std::string ns = is_symlink ? "trusted." : (rng_.Percent(85) || !is_root_ ? "user." : "trusted.");
  int count = static_cast<int>(rng_.Range(1, 5));
  bool big_used = false;
  for (int i = 0; i < count; ++i) {
    std::string name = ns + RandomName(1, 24);
    std::string value;
    switch (rng_.Below(5)) {
      case 0: break;  // empty value
      case 1: value = RandomBytes(rng_.Range(1, 40), true); break;
      case 2: value = RandomBytes(rng_.Range(1, 300), false); break;  // binary incl. NULs
      case 3:
        if (!big_used) {  // a few KiB; one per inode keeps ext4 (one xattr block) happy
          value = RandomBytes(rng_.Range(1024, 2800), false);
          big_used = true;
        } else {
          value = std::string(rng_.Range(1, 64), '\0');
        }
        break;
      default: value = fmt::format("value-{}", rng_.Next()); break;
    }
    bool ok = SetXattr(rel, name, value);
    if (is_symlink && ok) stats_.symlink_xattrs = true;
    if (is_symlink && !ok) return;  // not supported here: don't keep trying
  }
}

std::string Generator::RandomSymlinkTarget(const std::string& rel) {
  switch (rng_.Below(8)) {
    case 0: return RandomName(1, 8);                                   // short, probably dangling
    case 1: return "/etc/passwd";                                      // absolute
    case 2: return "../" + RandomName(1, 20);                          // relative, up
    case 3: return files_.empty() ? "x" : "/" + files_[rng_.Below(files_.size())];  // absolute-looking
    case 4: {                                                          // long: 1000..1900 bytes
      std::string t;
      size_t len = rng_.Range(1000, 1900);
      while (t.size() < len) t += RandomName(1, 40) + "/";
      t.resize(len);
      if (t.back() == '/') t.back() = 'z';
      return t;
    }
    case 5: return "dangling/does/not/exist/" + RandomName(3, 10);
    case 6: return ".";
    default: {  // relative path to an existing file from rel's directory
      if (files_.empty()) return "..";
      std::string dir = rel.substr(0, rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/'));
      std::string up;
      for (char c : dir)
        if (c == '/') up += "../";
      if (!dir.empty()) up += "../";
      return up + files_[rng_.Below(files_.size())];
    }
  }
}

// Files at the sizes where btrfs switches between inline and regular extents.
void Generator::BuildSizes() {
  MkDir("sizes", 0755);
  static const uint64_t kSizes[] = {0,    1,    2,    511,  512,   1023,  1024,  2047,   2048,   2049,
                                    3071, 3072, 3073, 3995, 3996,  4095,  4096,  4097,   8191,   8192,
                                    8193, 12288, 65535, 65536, 65537, 131071, 131072, 131073, 1048577};
  for (uint64_t s : kSizes) {
    std::string name = fmt::format("size_{}", s);
    Reserve("sizes", name);
    WriteFile("sizes/" + name, 0644, {{0, s}}, s);
  }
  // All-zero data (written, not sparse) and a file whose tail is a hole.
  {
    Reserve("sizes", "zeros_64k");
    std::string p = Abs("sizes/zeros_64k");
    int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) Fail("create", p);
    std::vector<char> z(65536 + 100, 0);
    if (write(fd, z.data(), z.size()) != static_cast<ssize_t>(z.size())) Fail("write", p);
    close(fd);
    pending_.push_back(Pending{"sizes/zeros_64k", 0644});
    files_.push_back("sizes/zeros_64k");
    ++stats_.files;
    ++created_;
  }
  Reserve("sizes", "small_then_hole");
  WriteFile("sizes/small_then_hole", 0644, {{0, 100}}, 20000);
  Reserve("sizes", "hole_then_small");
  WriteFile("sizes/hole_then_small", 0644, {{10000, 100}}, 10100);
  Reserve("sizes", "two_blocks_gap");
  WriteFile("sizes/two_blocks_gap", 0644, {{0, 4096}, {12288, 4096}}, 16384);
  Reserve("sizes", "unaligned_runs");
  WriteFile("sizes/unaligned_runs", 0644, {{1, 5000}, {9001, 3}, {70000, 12345}}, 90001);
}

void Generator::BuildWide() {
  if (o_.wide_dir_entries == 0) return;
  MkDir("wide", 0755);
  for (size_t i = 0; i < o_.wide_dir_entries; ++i) {
    std::string name = fmt::format("w{:05d}_{}", i, RandomName(0, 12));
    if (!Reserve("wide", name)) continue;
    std::string rel = "wide/" + name;
    uint64_t r = rng_.Below(100);
    if (r < 40) WriteFile(rel, RandomFileMode(), {}, 0);
    else if (r < 85) SmallFile(rel, rng_.Range(1, 3072));
    else if (r < 92) Symlink(rel, RandomSymlinkTarget(rel));
    else MkDir(rel, RandomDirMode());
  }
}

void Generator::BuildDeep() {
  if (o_.deep_depth <= 0) return;
  std::string dir = "deep";
  MkDir(dir, 0755);
  for (int d = 0; d < o_.deep_depth; ++d) {
    std::string name = fmt::format("level{:02d}{}", d, RandomName(0, 6));
    Reserve(dir, name);
    std::string sub = Join(dir, name);
    MkDir(sub, d % 7 == 3 ? 0700 : 0755);
    std::string f = fmt::format("file{:02d}", d);
    Reserve(sub, f);
    SmallFile(Join(sub, f), rng_.Range(0, d % 5 == 0 ? 20000 : 3000));
    dir = sub;
  }
  Reserve(dir, "bottom_link");
  Symlink(Join(dir, "bottom_link"), "../../../../file30");
  Reserve(dir, "bottom_big");
  WriteFile(Join(dir, "bottom_big"), 0644, {{0, 70000}}, 70000);
  dirs_.push_back(dir);
}

void Generator::BuildOdd() {
  if (!o_.odd_names) return;
  MkDir("odd", 0755);
  std::string all_high;
  for (int c = 0x80; c <= 0xff; ++c) all_high += static_cast<char>(c);
  std::string controls;
  for (int c = 1; c < 0x20; ++c) controls += static_cast<char>(c);
  std::string utf8_255;
  while (utf8_255.size() + 3 <= 255) utf8_255 += "\xe6\x97\xa5";  // 日 (3 bytes) x 85
  std::vector<std::string> names = {
      " leading space", "trailing space ", "a  b   c", " ", "new\nline", "tab\there", "cr\r",
      "-dash", "--", "-rf", "--help", "...", "....", "..a", ".hidden", "a.", "na\xc3\xafve",
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x83\x95\xe3\x82\xa1\xe3\x82\xa4\xe3\x83\xab",
      "emoji \xf0\x9f\x8e\x89", "e\xcc\x81", "\x80\x81\xfe\xff", "bad\xc3(", all_high, controls,
      "!\"#$%&'()*+,:;<=>?@[\\]^`{|}~", "star*", "q?", "IMAGE:colon", ":", "back\\slash",
      std::string(255, 'x'), utf8_255, std::string(254, '\xff') + "a", "\x7f" "del"};
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (!Reserve("odd", n)) continue;
    std::string rel = "odd/" + n;
    switch (i % 4) {
      case 0: SmallFile(rel, rng_.Range(0, 5000)); break;
      case 1: Symlink(rel, n); break;  // points at its own odd name
      case 2:
        MkDir(rel, 0755);
        Reserve(rel, n);
        SmallFile(rel + "/" + n, 100);  // a path with the odd name twice
        break;
      default: SmallFile(rel, 1); break;
    }
  }
  // A directory whose name holds a newline, with a normal tree inside.
  std::string d = "odd/dir\nwith newline";
  Reserve("odd", "dir\nwith newline");
  MkDir(d, 0755);
  for (int i = 0; i < 5; ++i) {
    std::string n = fmt::format("inner{}", i);
    Reserve(d, n);
    SmallFile(d + "/" + n, i * 1000);
  }
  // Symlink targets with odd bytes.
  Reserve("odd", "link_newline_target");
  Symlink("odd/link_newline_target", "a\nb");
  Reserve("odd", "link_high_bytes");
  Symlink("odd/link_high_bytes", all_high);
  Reserve("odd", "link_slashes");
  Symlink("odd/link_slashes", "//a//b///");
  if (o_.odd_times) {
    struct T {
      const char* name;
      int64_t sec;
      long nsec;
    };
    static const T kTimes[] = {{"time_negative", -1, 500000000}, {"time_1901", -2147483648LL, 1},
                               {"time_zero", 0, 0},             {"time_2200", 7258118400LL, 999999999},
                               {"time_2038", 2147483648LL, 123456789}};
    for (const auto& t : kTimes) {
      Reserve("odd", t.name);
      std::string rel = std::string("odd/") + t.name;
      SmallFile(rel, 10);
      fixed_times_[rel] = {static_cast<time_t>(t.sec), t.nsec};
    }
  }
  dirs_.push_back("odd");
}

void Generator::BuildBig() {
  MkDir("big", 0755);
  for (int i = 0; i < o_.large_files; ++i) {
    std::string name = fmt::format("large{:02d}", i);
    Reserve("big", name);
    uint64_t size = rng_.Range(1ull << 20, std::max<uint64_t>(o_.large_file_max, 1ull << 20));
    if (i % 2) size = size / 4096 * 4096;  // half of them sector multiples
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    uint64_t off = (i % 3 == 0) ? rng_.Range(1, 300000) : 0;  // some start with a hole
    while (off < size) {
      uint64_t len = std::min<uint64_t>(rng_.Range(1, 600000), size - off);
      runs.push_back({off, len});
      off += len;
      off += rng_.Percent(70) ? rng_.Range(1, 700000) : 0;
    }
    WriteFile("big/" + name, 0644, runs, size);
  }
  for (int i = 0; i < o_.sparse_files; ++i) {
    std::string name = fmt::format("sparse{:02d}", i);
    Reserve("big", name);
    uint64_t size = rng_.Range(2ull << 20, std::max<uint64_t>(o_.sparse_file_max, 2ull << 20));
    std::vector<std::pair<uint64_t, uint64_t>> runs;
    switch (i % 4) {
      case 0: runs = {{size - 3, 3}}; break;                          // a few bytes at the end
      case 1: runs = {{0, 100}, {size - 5000, 5000}}; break;          // head and tail
      case 2: break;                                                  // no data at all
      default: runs = {{size / 2 + 7, 4096 * 3 + 1}}; break;          // unaligned middle
    }
    WriteFile("big/" + name, 0644, runs, size);
  }
}

void Generator::BuildLinks() {
  if (!o_.hard_links) return;
  MkDir("links", 0755);
  Reserve("links", "target");
  WriteFile("links/target", 0644, {{0, 5000}}, 5000);
  MkDir("links/a", 0755);
  MkDir("links/b", 0755);
  MkDir("links/b/c", 0755);
  for (const char* n : {"links/a/same", "links/b/other name", "links/b/c/third", "links/alias"}) HardLink("links/target", n);
  // A hard-linked symlink and a hard-linked fifo.
  Reserve("links", "sym");
  Symlink("links/sym", "target");
  HardLink("links/sym", "links/a/sym_hardlink");
  if (o_.fifos) {
    Reserve("links", "fifo");
    Fifo("links/fifo");
    HardLink("links/fifo", "links/b/fifo_hardlink");
  }
  // Hard links to an empty and an inline file.
  Reserve("links", "empty");
  WriteFile("links/empty", 0600, {}, 0);
  HardLink("links/empty", "links/a/empty2");
  if (o_.many_links) {
    // ~100 long names for one inode in one directory: the INODE_REF item
    // overflows a leaf, so btrfs falls back to INODE_EXTREF items.
    MkDir("links/many", 0755);
    Reserve("links/many", "origin");
    WriteFile("links/many/origin", 0644, {{0, 777}}, 777);
    for (int i = 0; i < 100; ++i) {
      std::string n = fmt::format("{:03d}_{}", i, std::string(190, static_cast<char>('a' + i % 26)));
      Reserve("links/many", n);
      HardLink("links/many/origin", "links/many/" + n);
    }
  }
}

void Generator::BuildCollisions() {
  if (!o_.hash_collisions) return;
  MkDir("collide", 0755);
  // Birthday search for names with equal btrfs name hashes (~2^16 tries each).
  std::vector<std::pair<std::string, std::string>> pairs;
  std::unordered_map<uint32_t, std::string> seen;
  seen.reserve(1 << 18);
  static const char kAlnum[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  for (int tries = 0; pairs.size() < 3 && tries < 4000000; ++tries) {
    std::string n = "c_";
    for (int i = 0; i < 12; ++i) n += kAlnum[rng_.Below(36)];
    uint32_t h = BtrfsNameHash(n);
    auto [it, inserted] = seen.emplace(h, n);
    if (!inserted && it->second != n) {
      pairs.push_back({it->second, n});
      seen.erase(it);
    }
  }
  if (pairs.size() < 3) throw std::runtime_error("GenerateTree: no crc32c name collision found");
  // Pair 0: two files. Pair 1: a directory and a symlink.
  for (const auto& n : {pairs[0].first, pairs[0].second}) {
    Reserve("collide", n);
    SmallFile("collide/" + n, rng_.Range(1, 6000));
  }
  Reserve("collide", pairs[1].first);
  MkDir("collide/" + pairs[1].first, 0755);
  Reserve("collide/" + pairs[1].first, "inside");
  SmallFile("collide/" + pairs[1].first + "/inside", 10);
  Reserve("collide", pairs[1].second);
  Symlink("collide/" + pairs[1].second, pairs[1].first);
  // Pair 2: two xattr names with the same hash on one file.
  if (o_.xattrs) {
    Reserve("collide", "xattr_collision");
    WriteFile("collide/xattr_collision", 0644, {{0, 10}}, 10);
    SetXattr("collide/xattr_collision", "user." + pairs[2].first, "first value");
    SetXattr("collide/xattr_collision", "user." + pairs[2].second, "second value");
  }
  // Note: "user." + a and "user." + b do not collide just because a and b do;
  // search separately for xattr names.
  if (o_.xattrs) {
    seen.clear();
    for (int tries = 0; tries < 4000000; ++tries) {
      std::string n = "user.x_";
      for (int i = 0; i < 12; ++i) n += kAlnum[rng_.Below(36)];
      auto [it, inserted] = seen.emplace(BtrfsNameHash(n), n);
      if (!inserted && it->second != n) {
        SetXattr("collide/xattr_collision", it->second, "colliding name one");
        SetXattr("collide/xattr_collision", n, std::string("colliding\0name two", 18));
        break;
      }
    }
  }
}

void Generator::BuildSpecial() {
  MkDir("special", 0755);
  if (o_.fifos) {
    for (int i = 0; i < 4; ++i) {
      std::string n = fmt::format("fifo{}", i);
      Reserve("special", n);
      Fifo("special/" + n);
    }
    Reserve("special", "socket");
    Socket("special/socket");
  }
  if (o_.devices && is_root_) {
    struct D {
      const char* name;
      mode_t type;
      unsigned ma, mi;
    };
    static const D kDevs[] = {{"null_like", S_IFCHR, 1, 3},    {"block8_1", S_IFBLK, 8, 1},
                              {"big_minor", S_IFCHR, 259, 123456}, {"big_major", S_IFBLK, 4095, 1048575},
                              {"zero_zero", S_IFCHR, 0, 0}};
    for (const auto& d : kDevs) {
      Reserve("special", d.name);
      Device(std::string("special/") + d.name, d.type, makedev(d.ma, d.mi));
    }
  }
  if (o_.special_modes) {
    struct M {
      const char* name;
      mode_t mode;
      bool dir;
    };
    static const M kModes[] = {{"sticky_dir", 01777, true}, {"setgid_dir", 02775, true},
                               {"all_bits_dir", 07777, true}, {"setuid_file", 04755, false},
                               {"setgid_file", 02755, false}, {"mode_0000_dir", 0500, true},
                               {"mode_0400_file", 0400, false}, {"mode_0001_file", 0401, false}};
    for (const auto& m : kModes) {
      Reserve("special", m.name);
      std::string rel = std::string("special/") + m.name;
      if (m.dir) {
        MkDir(rel, 0755);
        pending_.back().mode = m.mode;
        Reserve(rel, "f");
        SmallFile(rel + "/f", 5);
      } else {
        WriteFile(rel, m.mode, {{0, 1234}}, 1234);
      }
    }
  }
  if (o_.xattrs) {
    // xattrs on a directory, an empty value, a multi-KiB value, many names.
    Reserve("special", "xattr_dir");
    MkDir("special/xattr_dir", 0755);
    SetXattr("special/xattr_dir", "user.dir_attr", "on a directory");
    SetXattr("special/xattr_dir", "user.empty", "");
    Reserve("special", "xattr_many");
    WriteFile("special/xattr_many", 0644, {{0, 100}}, 100);
    for (int i = 0; i < 40; ++i) SetXattr("special/xattr_many", fmt::format("user.n{:02d}", i), fmt::format("v{}", i));
    Reserve("special", "xattr_big");
    WriteFile("special/xattr_big", 0644, {}, 0);
    SetXattr("special/xattr_big", "user.big", RandomBytes(2900, false));
    SetXattr("special/xattr_big", "user.bin", std::string("\0\x01\xff\0", 4));
    if (is_root_) {
      Reserve("special", "xattr_symlink");
      Symlink("special/xattr_symlink", "xattr_dir");
      if (SetXattr("special/xattr_symlink", "trusted.on_symlink", "symlink xattr")) stats_.symlink_xattrs = true;
      SetXattr("special/xattr_dir", "trusted.dir", std::string(1000, 't'));
    }
  }
}

// system.posix_acl_* values in the kernel's xattr encoding.
std::string AclXattr(const std::vector<std::array<uint32_t, 3>>& entries) {
  std::string v;
  auto put32 = [&](uint32_t x) { for (int i = 0; i < 4; ++i) v += static_cast<char>((x >> (8 * i)) & 0xff); };
  auto put16 = [&](uint16_t x) { v += static_cast<char>(x & 0xff); v += static_cast<char>(x >> 8); };
  put32(2);  // POSIX_ACL_XATTR_VERSION
  for (const auto& e : entries) {
    put16(static_cast<uint16_t>(e[0]));
    put16(static_cast<uint16_t>(e[1]));
    put32(e[2]);
  }
  return v;
}

void Generator::BuildAcl() {
  if (!o_.acls) return;
  constexpr uint32_t kUserObj = 1, kUser = 2, kGroupObj = 4, kGroup = 8, kMask = 0x10, kOther = 0x20, kNone = ~0u;
  MkDir("acl", 0755);
  Reserve("acl", "file");
  WriteFile("acl/file", 0640, {{0, 42}}, 42);
  std::string access = AclXattr({{kUserObj, 6, kNone}, {kUser, 4, 1000}, {kUser, 6, 1234}, {kGroupObj, 4, kNone},
                                 {kGroup, 5, 100}, {kMask, 6, kNone}, {kOther, 0, kNone}});
  if (SetXattr("acl/file", "system.posix_acl_access", access)) stats_.acls = true;
  Reserve("acl", "dir");
  MkDir("acl/dir", 0755);
  std::string def = AclXattr({{kUserObj, 7, kNone}, {kUser, 5, 1000}, {kGroupObj, 5, kNone}, {kMask, 7, kNone},
                              {kOther, 5, kNone}});
  SetXattr("acl/dir", "system.posix_acl_default", def);
  // Created after the default ACL: inherits an access ACL from it.
  Reserve("acl/dir", "inherits");
  WriteFile("acl/dir/inherits", 0644, {{0, 7}}, 7);
}

void Generator::BuildRandom(size_t count) {
  MkDir("t", 0755);
  dirs_.push_back("t");
  std::vector<std::string> tdirs = {"t"};
  for (size_t i = 0; i < count; ++i) {
    // Prefer recent directories so the tree gets some depth.
    const std::string& dir = rng_.Percent(50) ? tdirs[tdirs.size() - 1 - rng_.Below(std::min<size_t>(tdirs.size(), 8))]
                                              : tdirs[rng_.Below(tdirs.size())];
    std::string parent = dir;  // copy: tdirs may grow
    std::string rel = Join(parent, UniqueName(parent, 1, 30));
    uint64_t r = rng_.Below(1000);
    if (r < 60) {
      MkDir(rel, RandomDirMode());
      tdirs.push_back(rel);
      if (o_.xattrs && rng_.Percent(10)) RandomXattrs(rel, false);
    } else if (r < 160) {
      WriteFile(rel, RandomFileMode(), {}, 0);
    } else if (r < 500) {
      SmallFile(rel, rng_.Range(1, 3072));
    } else if (r < 640) {
      uint64_t s = rng_.Range(3073, 64 * 1024);
      if (rng_.Percent(20)) s = s / 4096 * 4096;
      SmallFile(rel, s);
    } else if (r < 660) {
      uint64_t s = rng_.Range(64 * 1024, 300 * 1024);
      SmallFile(rel, s);
    } else if (r < 800) {
      Symlink(rel, RandomSymlinkTarget(rel));
    } else if (r < 900 && o_.hard_links && !files_.empty()) {
      HardLink(files_[rng_.Below(files_.size())], rel);
    } else if (r < 910 && o_.fifos) {
      Fifo(rel);
    } else {
      SmallFile(rel, rng_.Range(0, 100));
    }
  }
}

void Generator::FinalAttrs() {
  for (const auto& p : pending_) {
    std::string path = Abs(p.rel);
    if (p.chown && lchown(path.c_str(), p.uid, p.gid) != 0) Fail("lchown", path);
    if (!p.is_symlink && chmod(path.c_str(), p.mode) != 0) Fail("chmod", path);
  }
}

void Generator::SetTimes(const std::string& rel, bool is_dir) {
  struct timespec ts[2];
  uint64_t h = Fnv1a(rel, seed_ ^ 0x7153);
  auto it = fixed_times_.find(rel);
  if (it != fixed_times_.end()) {
    ts[1] = it->second;
  } else {
    // 2001 .. ~2033, arbitrary nanoseconds.
    ts[1].tv_sec = static_cast<time_t>(1000000000 + h % 1000000000);
    ts[1].tv_nsec = static_cast<long>((h >> 32) % 1000000000);
  }
  ts[0].tv_sec = ts[1].tv_sec + static_cast<time_t>(h % 86400) + (is_dir ? 1 : 0);
  ts[0].tv_nsec = static_cast<long>((h >> 20) % 1000000000);
  if (utimensat(AT_FDCWD, Abs(rel).c_str(), ts, AT_SYMLINK_NOFOLLOW) != 0) Fail("utimensat", Abs(rel));
}

TreeGenStats Generator::Run() {
  struct stat st;
  if (stat(root_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) Fail("not a directory:", root_, ENOTDIR);
  BuildSizes();
  BuildLinks();
  BuildCollisions();
  BuildSpecial();
  BuildAcl();
  BuildOdd();
  BuildBig();
  BuildDeep();
  BuildWide();
  size_t rest = o_.entries > created_ ? o_.entries - created_ : 0;
  BuildRandom(rest);
  FinalAttrs();
  // Times last, children before parents (creating entries changes a
  // directory's mtime). Walk in sorted order so hard links resolve the same way.
  std::vector<std::pair<std::string, bool>> order;  // (rel, is_dir), post-order
  std::function<void(const std::string&)> walk = [&](const std::string& rel) {
    std::string path = Abs(rel);
    DIR* d = opendir(path.c_str());
    if (!d) Fail("opendir", path);
    std::vector<std::string> names;
    while (struct dirent* e = readdir(d)) {
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names.push_back(e->d_name);
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      std::string child = Join(rel, n);
      struct stat cst;
      if (lstat(Abs(child).c_str(), &cst) != 0) Fail("lstat", Abs(child));
      if (S_ISDIR(cst.st_mode)) walk(child);
      else order.push_back({child, false});
    }
    order.push_back({rel, true});
  };
  walk("");
  for (const auto& [rel, is_dir] : order) SetTimes(rel, is_dir);
  // Fixed (odd) times last: a random hard link to one of these files must not
  // overwrite them.
  for (const auto& [rel, ts] : fixed_times_) SetTimes(rel, false);
  return stats_;
}

}  // namespace

uint32_t BtrfsNameHash(const std::string& name) { return Crc32cRaw(~1u, name.data(), name.size()); }

std::string TreeGenStats::Summary() const {
  return fmt::format(
      "{} dirs, {} files, {} symlinks, {} extra hard links, {} fifos, {} device/socket nodes, {} xattrs "
      "({} skipped), symlink xattrs {}, acls {}, {:.1f} MiB written, {:.1f} MiB apparent",
      dirs, files, symlinks, hard_links, fifos, devices, xattrs, xattrs_skipped, symlink_xattrs ? "yes" : "no",
      acls ? "yes" : "no", data_bytes / 1048576.0, apparent_bytes / 1048576.0);
}

TreeGenStats GenerateTreeWithStats(const std::string& dir, uint64_t seed, const TreeGenOptions& options) {
  Generator g(dir, seed, options);
  return g.Run();
}

void GenerateTree(const std::string& dir, uint64_t seed, const TreeGenOptions& options) {
  (void)GenerateTreeWithStats(dir, seed, options);
}

TreeGenOptions ScaledTreeOptions(size_t entries) {
  TreeGenOptions o;
  double f = static_cast<double>(entries) / o.entries;
  o.entries = entries;
  o.wide_dir_entries = std::max<size_t>(50, static_cast<size_t>(o.wide_dir_entries * f));
  o.large_files = std::max(1, static_cast<int>(o.large_files * f + 0.5));
  o.sparse_files = std::max(4, static_cast<int>(o.sparse_files * f + 0.5));
  if (f < 1) o.large_file_max = std::max<uint64_t>(1ull << 20, static_cast<uint64_t>(o.large_file_max * f));
  return o;
}

}  // namespace ubtrfs_test
