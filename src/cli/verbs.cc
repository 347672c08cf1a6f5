#include "cli/verbs.h"

#include <fnmatch.h>
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/text.h"
#include "ubtrfs/import.h"
#include "ubtrfs/export.h"

namespace ubtrfs::cli {
namespace {

using Paths = std::vector<std::string>;
// A verb's work on an open image; paths are inside the image.
using Body = std::function<Status(Filesystem&, const Paths&)>;

Status Err(int code, std::string m) { return Status::Error(code, std::move(m)); }
std::string Q(const std::string& p) { return "'" + Printable(p) + "'"; }

std::string Join(const std::string& dir, const std::string& name) {
  return dir.ends_with('/') ? dir + name : dir + "/" + name;
}

// The process's umask (umask(2) can only be read by setting it).
uint32_t CurrentUmask() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return static_cast<uint32_t>(mask);
}

NewInode Attrs(uint32_t mode) {
  NewInode a;
  a.mode = mode & ~CurrentUmask();
  a.uid = ::geteuid();
  a.gid = ::getegid();
  return a;
}

// Runs `body` the way the verb was called: in a session on its image, or
// on the IMAGE:PATH arguments (all of one image), with a commit after a
// changing verb.
void Run(VerbSession* session, const std::string& verb, bool write, const Paths& args, const Body& body) {
  if (session != nullptr) {
    session->writes = write;
    Status st = body(*session->fs, args);
    if (!st.ok()) session->status = Status::Error(st.code(), verb + ": " + st.message());
    return;
  }
  std::string image;
  Paths paths;
  for (const auto& a : args) {
    std::string img, path;
    if (!SplitImagePath(a, &img, &path)) {
      fmt::print(stderr, "ubtrfs: {}: expected IMAGE:PATH, got '{}'\n", verb, a);
      return SetExitCode(2);
    }
    if (!image.empty() && img != image) {
      fmt::print(stderr, "ubtrfs: {}: every path must be in the same image ({} and {})\n", verb, image, img);
      return SetExitCode(2);
    }
    image = img;
    paths.push_back(path);
  }
  OpenOptions o;
  o.writable = write;
  PlacementInto(&o);
  SubvolOptionsInto(&o);
  auto fs = Filesystem::Open(image, o);
  if (!fs.ok()) {
    fmt::print(stderr, "ubtrfs: {}: {}: {}\n", verb, image, fs.status().ToString());
    if (!write) HintRescue(fs.status());
    return SetExitCode(1);
  }
  for (const auto& w : (*fs)->Warnings()) fmt::print(stderr, "ubtrfs: warning: {}: {}\n", image, w);
  Status st = body(**fs, paths);
  if (st.ok() && write) st = (*fs)->Commit();
  if (!st.ok()) {
    if (write) (void)(*fs)->Discard();
    fmt::print(stderr, "ubtrfs: {}: {}\n", verb, st.message());
    if (!write) HintRescue(st);
    SetExitCode(1);
  }
}

Result<InodeId> Find(Filesystem& fs, const std::string& path, const char* what) {
  auto id = fs.Lookup(path);
  if (!id.ok()) return Err(id.status().code(), std::string(what) + " " + Q(path) + ": " + strerror(id.status().code()));
  return *id;
}

// The attr tools (setfattr, getfattr) name a file without quotes: "PATH: error".
Result<InodeId> FindAttr(Filesystem& fs, const std::string& path) {
  auto id = fs.Lookup(path);
  if (!id.ok()) return Err(id.status().code(), Printable(path) + ": " + strerror(id.status().code()));
  return *id;
}

// ENODATA as the attr tools word it.
std::string XattrError(int code) { return code == ENODATA ? "No such attribute" : strerror(code); }

// -------------------------------------------------------------- mv, ln

Status Move(Filesystem& fs, const Paths& p) {
  if (p.size() < 2) return Err(EINVAL, "missing destination file operand");
  const std::string& dst = p.back();
  auto dst_id = fs.Lookup(dst);
  bool dst_dir = false;
  if (dst_id.ok()) {
    UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(*dst_id));
    dst_dir = S_ISDIR(st.mode);
  }
  if (p.size() > 2 && !dst_dir) {
    const int code = dst_id.ok() ? ENOTDIR : dst_id.status().code();
    return Err(code, "target " + Q(dst) + ": " + strerror(code));
  }
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    auto [sp, sn] = SplitLast(p[i]);
    UB_ASSIGN_OR_RETURN(InodeId sdir, Find(fs, sp, "cannot stat"));
    auto src = fs.LookupChild(sdir, sn);
    if (!src.ok()) return Err(ENOENT, "cannot stat " + Q(p[i]) + ": No such file or directory");
    UB_ASSIGN_OR_RETURN(Stat sst, fs.GetStat(*src));
    const std::string to = dst_dir ? Join(dst, sn) : dst;
    auto [dp, dn] = SplitLast(to);
    auto ddir = fs.Lookup(dp);
    if (!ddir.ok()) {
      return Err(ddir.status().code(), "cannot move " + Q(p[i]) + " to " + Q(to) + ": " +
                                           strerror(ddir.status().code()));
    }
    if (*ddir == sdir && dn == sn) return Err(EINVAL, Q(p[i]) + " and " + Q(to) + " are the same file");
    Status st = fs.Rename(sdir, sn, *ddir, dn);
    if (!st.ok()) {
      // As mv(1) words the cases rename(2) answers with these codes.
      if (st.code() == EINVAL && S_ISDIR(sst.mode)) {
        return Err(EINVAL, "cannot move " + Q(p[i]) + " to a subdirectory of itself, " + Q(to));
      }
      if (st.code() == ENOTDIR && S_ISDIR(sst.mode)) {
        return Err(ENOTDIR, "cannot overwrite non-directory " + Q(to) + " with directory " + Q(p[i]));
      }
      if (st.code() == EISDIR && !S_ISDIR(sst.mode)) {
        return Err(EISDIR, "cannot overwrite directory " + Q(to) + " with non-directory");
      }
      return Err(st.code(), "cannot move " + Q(p[i]) + " to " + Q(to) + ": " + strerror(st.code()));
    }
  }
  return Status::Ok();
}

Status LinkOne(Filesystem& fs, const std::string& target, const std::string& link, bool symbolic, bool force) {
  std::string where = link;
  if (auto l = fs.Lookup(link); l.ok()) {
    UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(*l));
    if (S_ISDIR(st.mode)) where = Join(link, SplitLast(target).second);
  }
  const std::string what = std::string("failed to create ") + (symbolic ? "symbolic" : "hard") + " link " + Q(where);
  std::optional<InodeId> t;
  if (!symbolic) {
    UB_ASSIGN_OR_RETURN(t, Find(fs, target, "failed to access"));
    UB_ASSIGN_OR_RETURN(Stat tst, fs.GetStat(*t));
    if (S_ISDIR(tst.mode)) return Err(EPERM, Printable(target) + ": hard link not allowed for directory");
  }
  // ln(1) names the link, and for a hard link also what it points at.
  auto failed = [&](int code) {
    return Err(code, what + (symbolic || code == EEXIST ? "" : " => " + Q(target)) + ": " + strerror(code));
  };
  auto [dp, dn] = SplitLast(where);
  auto dir = fs.Lookup(dp);
  if (!dir.ok()) return failed(dir.status().code());
  if (force && fs.LookupChild(*dir, dn).ok()) UB_RETURN_IF_ERROR(fs.Unlink(*dir, dn));
  Status st = symbolic ? fs.Symlink(*dir, dn, target, Attrs(0777)).status() : fs.Link(*t, *dir, dn);
  if (!st.ok()) return failed(st.code());
  return Status::Ok();
}

// -------------------------------------------------------------- chmod, chown, touch, truncate

// An octal mode, or symbolic clauses as chmod(1) takes them ("u+x,go-w").
Result<uint32_t> ParseMode(const std::string& text, uint32_t old, bool is_dir) {
  if (!text.empty() && text.find_first_not_of("01234567") == std::string::npos) {
    if (text.size() > 8) return Err(EINVAL, "invalid mode: " + Q(text));
    const unsigned long m = std::stoul(text, nullptr, 8);
    if (m > 07777) return Err(EINVAL, "invalid mode: " + Q(text));
    // As chmod(1): fewer than five digits keep a directory's set-user-ID
    // and set-group-ID bits.
    if (is_dir && text.size() < 5) return static_cast<uint32_t>(m) | (old & 06000);
    return static_cast<uint32_t>(m);
  }
  uint32_t mode = old & 07777;
  size_t i = 0;
  while (i <= text.size()) {
    uint32_t who = 0;
    for (; i < text.size() && std::strchr("ugoa", text[i]); ++i) {
      who |= text[i] == 'u' ? 04700u : text[i] == 'g' ? 02070u : text[i] == 'o' ? 01007u : 07777u;
    }
    const bool all = who == 0;
    if (all) who = 07777;
    if (i >= text.size() || !std::strchr("+-=", text[i])) return Err(EINVAL, "invalid mode: " + Q(text));
    while (i < text.size() && std::strchr("+-=", text[i])) {
      const char op = text[i++];
      uint32_t bits = 0;
      const bool copy = i < text.size() && std::strchr("ugo", text[i]);
      if (copy) {
        // "go=u": the permissions a class has now, copied to the others.
        const int shift = text[i] == 'u' ? 6 : text[i] == 'g' ? 3 : 0;
        bits = ((mode >> shift) & 7u) * 0111u;
        ++i;
      }
      bool set_id = false;
      for (; !copy && i < text.size() && std::strchr("rwxXst", text[i]); ++i) {
        switch (text[i]) {
          case 'r': bits |= 0444; break;
          case 'w': bits |= 0222; break;
          case 'x': bits |= 0111; break;
          case 'X': if (is_dir || (mode & 0111)) bits |= 0111; break;  // as the mode is by now
          case 's': bits |= 06000; set_id = true; break;
          case 't': bits |= 01000; break;
        }
      }
      bits &= who;
      if (all) bits &= ~CurrentUmask();
      if (op == '+') {
        mode |= bits;
      } else if (op == '-') {
        mode &= ~bits;
      } else {
        // '=' clears what it governs (as chmod(1): not a directory's
        // set-user-ID/set-group-ID bits unless 's' was named).
        uint32_t cleared = who & 07777;
        if (is_dir && !set_id) cleared &= ~06000u;
        mode = (mode & ~cleared) | bits;
      }
    }
    if (i >= text.size()) break;
    if (text[i] != ',') return Err(EINVAL, "invalid mode: " + Q(text));
    ++i;
  }
  return mode;
}

// A user or group name or number of chown's OWNER[:GROUP] `spec` (which the
// error quotes whole, as chown(1) does).
Result<uint32_t> ParseId(const std::string& s, bool group, const std::string& spec) {
  const std::string bad = std::string("invalid ") + (group ? "group" : "user") + ": " + Q(spec);
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string::npos) {
    if (s.size() > 10 || std::stoull(s) > UINT32_MAX - 1) return Err(EINVAL, bad);
    return static_cast<uint32_t>(std::stoull(s));
  }
  if (group) {
    if (const struct group* g = ::getgrnam(s.c_str())) return static_cast<uint32_t>(g->gr_gid);
    return Err(EINVAL, bad);
  }
  if (const struct passwd* pw = ::getpwnam(s.c_str())) return static_cast<uint32_t>(pw->pw_uid);
  return Err(EINVAL, bad);
}

// touch -d: "@SECONDS[.FRACTION]", "now", or "YYYY-MM-DD[ |T]HH:MM[:SS[.FRACTION]]" in local time.
Result<Time> ParseDate(const std::string& s) {
  Time t;
  auto frac = [](const char* p) {
    uint32_t ns = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 9; ++p, ++digits) ns = ns * 10 + static_cast<uint32_t>(*p - '0');
    for (; digits < 9; ++digits) ns *= 10;
    return ns;
  };
  if (s == "now") {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return Time{ts.tv_sec, static_cast<uint32_t>(ts.tv_nsec)};
  }
  if (s.starts_with("@")) {
    char* end = nullptr;
    const long long secs = std::strtoll(s.c_str() + 1, &end, 10);
    if (end == s.c_str() + 1 || (*end != '\0' && *end != '.')) return Err(EINVAL, "invalid date format " + Q(s));
    t.sec = secs;
    if (*end == '.') t.nsec = frac(end + 1);
    return t;
  }
  struct tm tm {};
  const char* rest = strptime(s.c_str(), "%Y-%m-%d", &tm);
  if (rest == nullptr) return Err(EINVAL, "invalid date format " + Q(s));
  if (*rest == ' ' || *rest == 'T') {
    const char* r2 = strptime(rest + 1, "%H:%M:%S", &tm);
    if (r2 == nullptr) r2 = strptime(rest + 1, "%H:%M", &tm);
    if (r2 == nullptr) return Err(EINVAL, "invalid date format " + Q(s));
    rest = r2;
    if (*rest == '.') {
      t.nsec = frac(rest + 1);
      rest += 1 + std::strspn(rest + 1, "0123456789");
    }
  }
  if (*rest != '\0') return Err(EINVAL, "invalid date format " + Q(s));
  tm.tm_isdst = -1;
  t.sec = static_cast<int64_t>(mktime(&tm));
  return t;
}

// truncate -s: [+-]N[K|M|G|T|P|E][B|iB]: K = 1024, KB = 1000.
Result<std::pair<char, uint64_t>> ParseSize(const std::string& s) {
  size_t i = 0;
  char rel = 0;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) rel = s[i++];
  size_t digits = 0;
  uint64_t n = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++digits) {
    if (n > (UINT64_MAX - 9) / 10) return Err(EFBIG, "Invalid number: " + Q(s));
    n = n * 10 + static_cast<uint64_t>(s[i] - '0');
  }
  if (digits == 0) return Err(EINVAL, "Invalid number: " + Q(s));
  if (i < s.size()) {
    const char* units = "KMGTPE";
    const char* u = std::strchr(units, std::toupper(static_cast<unsigned char>(s[i])));
    if (u == nullptr || *u == '\0') return Err(EINVAL, "Invalid number: " + Q(s));
    const std::string tail = s.substr(i + 1);
    uint64_t base = tail == "B" ? 1000 : (tail.empty() || tail == "iB") ? 1024 : 0;
    if (base == 0) return Err(EINVAL, "Invalid number: " + Q(s));
    for (int k = 0; k <= u - units; ++k) {
      if (n > UINT64_MAX / base) return Err(EFBIG, "Invalid number: " + Q(s));
      n *= base;
    }
  }
  return std::pair{rel, n};
}

Result<InodeId> OpenOrCreate(Filesystem& fs, const std::string& path, bool create) {
  auto id = fs.Lookup(path);
  if (id.ok() || id.status().code() != ENOENT || !create) return id;
  auto [dp, dn] = SplitLast(path);
  UB_ASSIGN_OR_RETURN(InodeId dir, fs.Lookup(dp));
  return fs.Create(dir, dn, Attrs(0666));
}

// -------------------------------------------------------------- xattrs

// setfattr -v: "0x" hex, "0s" base64, a quoted string, or the text itself.
Result<std::string> DecodeValue(const std::string& v) {
  if (v.size() >= 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) {
    std::string out;
    for (size_t i = 2; i + 1 < v.size() + 1; i += 2) {
      if (i + 1 >= v.size()) return Err(EINVAL, "bad hex value " + Q(v));
      out.push_back(static_cast<char>(std::stoi(v.substr(i, 2), nullptr, 16)));
    }
    return out;
  }
  if (v.size() >= 2 && v[0] == '0' && (v[1] == 's' || v[1] == 'S')) {
    static const std::string kB64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 2; i < v.size() && v[i] != '='; ++i) {
      const size_t d = kB64.find(v[i]);
      if (d == std::string::npos) return Err(EINVAL, "bad base64 value " + Q(v));
      acc = acc << 6 | static_cast<uint32_t>(d);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out.push_back(static_cast<char>((acc >> bits) & 0xff));
      }
    }
    return out;
  }
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  return v;
}

// As getfattr prints a value: quoted text when it is printable, else 0s base64.
std::string EncodeValue(const std::string& v) {
  bool text = true;
  for (size_t i = 0; i < v.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f || (c == 0 && i + 1 != v.size())) text = false;
  }
  if (text) {
    std::string t = v;
    if (!t.empty() && t.back() == '\0') t.pop_back();
    return "\"" + t + "\"";
  }
  static const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out = "0s";
  for (size_t i = 0; i < v.size(); i += 3) {
    uint32_t n = static_cast<uint32_t>(static_cast<unsigned char>(v[i])) << 16;
    if (i + 1 < v.size()) n |= static_cast<uint32_t>(static_cast<unsigned char>(v[i + 1])) << 8;
    if (i + 2 < v.size()) n |= static_cast<unsigned char>(v[i + 2]);
    out.push_back(kB64[n >> 18 & 63]);
    out.push_back(kB64[n >> 12 & 63]);
    out.push_back(i + 1 < v.size() ? kB64[n >> 6 & 63] : '=');
    out.push_back(i + 2 < v.size() ? kB64[n & 63] : '=');
  }
  return out;
}

// -------------------------------------------------------------- stat, find, du, tree

// Allocated bytes as the kernel's btrfs reports them (st_blocks): the
// bytes of the inode's extents, rounded up to whole sectors (an inline file
// of 6 bytes holds one).
uint64_t Allocated(const Stat& s) { return (s.nbytes + 4095) / 4096 * 4096; }

const char* TypeName(uint32_t mode, uint64_t size) {
  switch (mode & S_IFMT) {
    case S_IFREG: return size == 0 ? "regular empty file" : "regular file";
    case S_IFDIR: return "directory";
    case S_IFLNK: return "symbolic link";
    case S_IFCHR: return "character special file";
    case S_IFBLK: return "block special file";
    case S_IFIFO: return "fifo";
    case S_IFSOCK: return "socket";
    default: return "weird file";
  }
}

std::string StatTime(const Time& t) {
  char buf[64];
  time_t secs = static_cast<time_t>(t.sec);
  struct tm tm;
  localtime_r(&secs, &tm);
  strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  char zone[16];
  strftime(zone, sizeof zone, "%z", &tm);
  return fmt::format("{}.{:09} {}", buf, t.nsec, zone);
}

std::string UserName(uint32_t uid) {
  const struct passwd* pw = ::getpwuid(uid);
  return pw ? pw->pw_name : "UNKNOWN";
}
std::string GroupName(uint32_t gid) {
  const struct group* g = ::getgrgid(gid);
  return g ? g->gr_name : "UNKNOWN";
}

Status StatOne(Filesystem& fs, const std::string& path, bool json) {
  UB_ASSIGN_OR_RETURN(InodeId id, Find(fs, path, "cannot stat"));
  UB_ASSIGN_OR_RETURN(Stat s, fs.GetStat(id));
  std::string link;
  if (S_ISLNK(s.mode)) {
    auto t = fs.ReadLink(id);
    if (t.ok()) link = *t;
  }
  if (json) {
    auto t = [](const Time& x) { return fmt::format("{}.{:09}", x.sec, x.nsec); };
    fmt::print(
        "{{\"path\": {}, \"type\": \"{}\", \"subvolume\": {}, \"inode\": {}, \"mode\": {}, \"mode_octal\": \"{:04o}\", "
        "\"nlink\": {}, \"uid\": {}, \"gid\": {}, \"rdev_major\": {}, \"rdev_minor\": {}, \"size\": {}, "
        "\"bytes\": {}, \"generation\": {}, \"flags\": {}, \"atime\": {}, \"mtime\": {}, \"ctime\": {}, "
        "\"otime\": {}{}}}\n",
        JsonString(path), TypeName(s.mode, s.size), id.root, id.ino, s.mode, s.mode & 07777, s.nlink, s.uid, s.gid,
        major(static_cast<dev_t>(s.rdev)), minor(static_cast<dev_t>(s.rdev)), s.size, s.nbytes, s.generation, s.flags,
        t(s.atime), t(s.mtime), t(s.ctime), t(s.otime),
        S_ISLNK(s.mode) ? ", \"target\": " + JsonString(link) : "");
    return Status::Ok();
  }
  fmt::print("  File: {}{}\n", Printable(path), S_ISLNK(s.mode) ? " -> " + Printable(link) : "");
  fmt::print("  Size: {:<15} Blocks: {:<10} IO Block: 4096   {}\n", s.size, Allocated(s) / 512, TypeName(s.mode, s.size));
  fmt::print("Subvol: {:<14} Inode: {:<11} Links: {}", id.root, id.ino, s.nlink);
  if (S_ISCHR(s.mode) || S_ISBLK(s.mode)) {
    fmt::print("     Device type: {},{}", major(static_cast<dev_t>(s.rdev)), minor(static_cast<dev_t>(s.rdev)));
  }
  fmt::print("\n");
  fmt::print("Access: ({:04o}/{})  Uid: ({:5}/{:>8})   Gid: ({:5}/{:>8})\n", s.mode & 07777, ModeString(s.mode),
             s.uid, UserName(s.uid), s.gid, GroupName(s.gid));
  fmt::print("Access: {}\nModify: {}\nChange: {}\n Birth: {}\n", StatTime(s.atime), StatTime(s.mtime),
             StatTime(s.ctime), StatTime(s.otime));
  return Status::Ok();
}

struct FindSpec {
  std::string name;  // -name GLOB
  char type = 0;     // -type f|d|l|c|b|p|s
  int maxdepth = -1, mindepth = 0;
};

bool TypeMatches(char t, uint32_t mode) {
  switch (t) {
    case 0: return true;
    case 'f': return S_ISREG(mode);
    case 'd': return S_ISDIR(mode);
    case 'l': return S_ISLNK(mode);
    case 'c': return S_ISCHR(mode);
    case 'b': return S_ISBLK(mode);
    case 'p': return S_ISFIFO(mode);
    case 's': return S_ISSOCK(mode);
    default: return false;
  }
}

// What a walk (find, du, tree) could not read: each path's error is printed
// as find(1) and du(1) print theirs and the walk goes on past it; the verb
// fails at the end. Entries a salvaging ReadDir (--rescue salvage) could
// not list are warned of as ls does, and names lost with them are errors.
class WalkErrors {
 public:
  explicit WalkErrors(std::string verb) : verb_(std::move(verb)) {}
  void Add(const std::string& path, const Status& st) {
    fmt::print(stderr, "ubtrfs: {}: {}: {}\n", verb_, Q(path), st.message());
    HintRescue(st);
    if (count_++ == 0) code_ = st.code();
  }
  // The directory's entries; nullopt (and the error noted) when it does not read.
  std::optional<std::vector<DirEntry>> ReadDir(Filesystem& fs, InodeId id, const std::string& path) {
    std::vector<SkippedEntry> skipped;
    auto entries = fs.ReadDir(id, &skipped);
    if (!entries.ok()) {
      Add(path, entries.status());
      return std::nullopt;
    }
    for (const auto& s : skipped) {
      if (s.name.empty() && s.lost) {
        Add(path, Status::Corrupt(s.reason));
      } else {
        WarnSkipped(path, s);
      }
    }
    return std::move(*entries);
  }
  Status Done() const {
    if (count_ == 0) return Status::Ok();
    return Status::Error(code_, std::to_string(count_) + " path(s) could not be read; the rest was walked");
  }

 private:
  std::string verb_;
  int count_ = 0;
  int code_ = 0;
};

void FindWalk(Filesystem& fs, InodeId id, const std::string& path, const std::string& name, int depth,
              const FindSpec& spec, std::set<std::pair<uint64_t, uint64_t>>& dirs, WalkErrors& errors) {
  auto s = fs.GetStat(id);
  if (!s.ok()) return errors.Add(path, s.status());
  if (depth >= spec.mindepth && TypeMatches(spec.type, s->mode) &&
      (spec.name.empty() || fnmatch(spec.name.c_str(), name.c_str(), 0) == 0)) {
    fmt::print("{}\n", path);
  }
  if (!S_ISDIR(s->mode) || (spec.maxdepth >= 0 && depth >= spec.maxdepth)) return;
  if (!dirs.insert({id.root, id.ino}).second) return;  // a loop in a damaged image
  auto entries = errors.ReadDir(fs, id, path);
  if (!entries) return;
  for (const auto& e : *entries) FindWalk(fs, e.id, Join(path, e.name), e.name, depth + 1, spec, dirs, errors);
}

struct DuSpec {
  bool summarize = false, all = false, bytes = false, human = false, json = false;
};

std::string DuSize(uint64_t n, const DuSpec& spec) {
  if (spec.bytes) return std::to_string(n);
  if (spec.human) {
    // As coreutils' -h: powers of 1024, rounded up; one decimal below 10.
    const char* units = "KMGTPE";
    if (n < 1024) return std::to_string(n);
    double v = static_cast<double>(n);
    int u = -1;
    while (v >= 1024 && u < 5) {
      v /= 1024;
      ++u;
    }
    if (v < 10) {
      const double tenths = std::ceil(v * 10 - 1e-9);
      if (tenths < 100) return fmt::format("{}.{}{}", static_cast<int>(tenths) / 10, static_cast<int>(tenths) % 10, units[u]);
      v = 10;
    }
    double whole = std::ceil(v - 1e-9);
    if (whole >= 1024 && u < 5) return fmt::format("1.0{}", units[u + 1]);
    return fmt::format("{}{}", static_cast<uint64_t>(whole), units[u]);
  }
  return std::to_string((n + 1023) / 1024);
}

// Post-order as du(1): each directory's total after its contents; a file
// with several links counts once. -b counts apparent sizes, otherwise the
// allocated bytes.
uint64_t DuWalk(Filesystem& fs, InodeId id, const std::string& path, int depth, const DuSpec& spec,
                std::set<std::pair<uint64_t, uint64_t>>& seen, std::string* json, WalkErrors& errors) {
  auto st = fs.GetStat(id);
  if (!st.ok()) {
    errors.Add(path, st.status());
    return 0;
  }
  const Stat& s = *st;
  if (!seen.insert({id.root, id.ino}).second) return 0;
  uint64_t total = spec.bytes ? s.size : Allocated(s);
  if (S_ISDIR(s.mode)) {
    // As du(1): a directory that does not read still counts what it is.
    if (auto entries = errors.ReadDir(fs, id, path)) {
      for (const auto& e : *entries) total += DuWalk(fs, e.id, Join(path, e.name), depth + 1, spec, seen, json, errors);
    }
  }
  if (depth == 0 || (!spec.summarize && (S_ISDIR(s.mode) || spec.all))) {
    if (spec.json) {
      *json += fmt::format("{}{{\"path\": {}, \"bytes\": {}}}", json->empty() ? "" : ", ", JsonString(path), total);
    } else {
      fmt::print("{}\t{}\n", DuSize(total, spec), path);
    }
  }
  return total;
}

// Where a path inside the image leads, following symlinks on the way and
// at the end (at most 40, as the kernel), "." and ".." as the kernel does.
Result<InodeId> ResolveFollowing(Filesystem& fs, const std::string& path) {
  std::vector<InodeId> stack{fs.Root()};  // the directories walked down
  std::vector<std::string> todo;          // components left, last first
  auto push = [&todo](const std::string& p) {
    std::vector<std::string> parts;
    for (size_t at = 0; at <= p.size();) {
      const size_t slash = std::min(p.find('/', at), p.size());
      if (slash > at) parts.push_back(p.substr(at, slash - at));
      at = slash + 1;
    }
    todo.insert(todo.end(), parts.rbegin(), parts.rend());
  };
  push(path);
  for (int links = 0; !todo.empty();) {
    const std::string name = std::move(todo.back());
    todo.pop_back();
    if (name == ".") continue;
    if (name == "..") {
      if (stack.size() > 1) stack.pop_back();
      continue;
    }
    UB_ASSIGN_OR_RETURN(InodeId next, fs.LookupChild(stack.back(), name));
    UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(next));
    if (!S_ISLNK(st.mode)) {
      stack.push_back(next);
      continue;
    }
    if (++links > 40) return Status::Error(ELOOP, path + ": too many levels of symbolic links");
    UB_ASSIGN_OR_RETURN(std::string target, fs.ReadLink(next));
    if (!target.empty() && target[0] == '/') stack.resize(1);
    push(target);
  }
  return stack.back();
}

// As tree(1) 2.x: names starting with '.' only with -a; a symlink that
// leads to a directory counts as one; the top directory counts too; the
// line under a directory that goes on is "│", two no-break spaces, a space.
void TreeWalk(Filesystem& fs, InodeId id, const std::string& path, const std::string& prefix, int depth,
              int max_depth, bool all, uint64_t* dirs, uint64_t* files, std::set<std::pair<uint64_t, uint64_t>>& seen,
              WalkErrors& errors) {
  if (max_depth >= 0 && depth >= max_depth) return;
  if (!seen.insert({id.root, id.ino}).second) return;
  auto read = errors.ReadDir(fs, id, path);
  if (!read) return;
  std::vector<DirEntry>& entries = *read;
  if (!all) std::erase_if(entries, [](const DirEntry& e) { return !e.name.empty() && e.name[0] == '.'; });
  std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
  for (size_t i = 0; i < entries.size(); ++i) {
    const bool last = i + 1 == entries.size();
    const auto& e = entries[i];
    std::string line = prefix + (last ? "└── " : "├── ") + Printable(e.name);
    auto st = fs.GetStat(e.id);
    if (!st.ok()) {  // as tree(1) marks what it cannot open
      fmt::print("{}  [error]\n", line);
      errors.Add(Join(path, e.name), st.status());
      continue;
    }
    const Stat& s = *st;
    bool dir = S_ISDIR(s.mode);
    if (S_ISLNK(s.mode)) {
      auto t = fs.ReadLink(e.id);
      line += " -> " + (t.ok() ? Printable(*t) : std::string("?"));
      if (t.ok()) {
        auto to = ResolveFollowing(fs, !t->empty() && (*t)[0] == '/' ? *t : path + "/" + *t);
        if (to.ok()) {
          auto ts = fs.GetStat(*to);
          dir = ts.ok() && S_ISDIR(ts->mode);
        }
      }
    }
    fmt::print("{}\n", line);
    if (dir) {
      ++*dirs;
      if (S_ISDIR(s.mode)) {
        TreeWalk(fs, e.id, Join(path, e.name), prefix + (last ? "    " : "│\u00a0\u00a0 "), depth + 1, max_depth,
                 all, dirs, files, seen, errors);
      }
    } else {
      ++*files;
    }
  }
}

Status RemoveTree(Filesystem& fs, InodeId dir, const std::string& name) {
  UB_ASSIGN_OR_RETURN(InodeId id, fs.LookupChild(dir, name));
  UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(id));
  if (!S_ISDIR(st.mode)) return fs.Unlink(dir, name);
  UB_ASSIGN_OR_RETURN(auto entries, fs.ReadDir(id));
  for (const auto& e : entries) UB_RETURN_IF_ERROR(RemoveTree(fs, id, e.name));
  return fs.Rmdir(dir, name);
}

Status WriteAll(Filesystem& fs, InodeId id, int fd) {
  UB_RETURN_IF_ERROR(fs.SetAttr(id, AttrChange{.size = 0}));
  std::vector<uint8_t> buf(1 << 20);
  uint64_t off = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Err(errno, std::string("reading standard input: ") + strerror(errno));
    }
    if (n == 0) break;
    UB_ASSIGN_OR_RETURN(size_t w, fs.Write(id, off, std::span<const uint8_t>(buf.data(), static_cast<size_t>(n))));
    off += w;
  }
  return Status::Ok();
}

}  // namespace

void RegisterVerbs(CLI::App& app, VerbSession* session) {
  const bool edit = session != nullptr;
  const std::string P = edit ? "PATH" : "IMAGE:PATH";
  auto paths = std::make_shared<Paths>();

  auto* mv = app.add_subcommand("mv", "Rename or move files (" + P + "... DEST)");
  mv->add_option("paths", *paths, "SOURCE... DEST")->required()->expected(2, -1);
  mv->callback([=] { Run(session, "mv", true, *paths, Move); });

  {
    struct O {
      bool symbolic = false, force = false;
      std::string target;
      Paths links;
    };
    auto o = std::make_shared<O>();
    auto* ln = app.add_subcommand("ln", "Make a hard link, or with -s a symbolic link (TARGET " + P + ")");
    ln->add_flag("-s,--symbolic", o->symbolic, "Make a symbolic link holding TARGET as its text");
    ln->add_flag("-f,--force", o->force, "Remove an existing destination first");
    ln->add_option("target", o->target, edit ? "TARGET" : "TARGET (IMAGE:PATH for a hard link)")->required();
    ln->add_option("link", o->links, P + " of the new link (or a directory to put it in)")->required()->expected(1);
    ln->callback([=] {
      if (o->symbolic) {
        Run(session, "ln", true, o->links, [=](Filesystem& fs, const Paths& p) {
          return LinkOne(fs, o->target, p[0], true, o->force);
        });
      } else {
        Paths args{o->target, o->links[0]};
        Run(session, "ln", true, args, [=](Filesystem& fs, const Paths& p) {
          return LinkOne(fs, p[0], p[1], false, o->force);
        });
      }
    });
  }

  {
    struct O {
      std::string mode;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* chmod = app.add_subcommand("chmod", "Change permission bits (MODE " + P + "...)");
    chmod->add_option("mode", o->mode, "Octal (0755) or symbolic (u+x,go-w)")->required();
    chmod->add_option("files", o->files, P)->required();
    chmod->callback([=] {
      Run(session, "chmod", true, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        for (const auto& path : p) {
          UB_ASSIGN_OR_RETURN(InodeId id, Find(fs, path, "cannot access"));
          UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(id));
          if (S_ISLNK(st.mode)) continue;  // as chmod: the mode of a symlink is not changed
          UB_ASSIGN_OR_RETURN(uint32_t m, ParseMode(o->mode, st.mode, S_ISDIR(st.mode)));
          UB_RETURN_IF_ERROR(fs.SetAttr(id, AttrChange{.mode = m}));
        }
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      std::string owner;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* chown = app.add_subcommand("chown", "Change owner and group (OWNER[:GROUP] " + P + "...)");
    chown->add_option("owner", o->owner, "USER[:GROUP] or :GROUP, names or numbers")->required();
    chown->add_option("files", o->files, P)->required();
    chown->callback([=] {
      Run(session, "chown", true, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        AttrChange c;
        const size_t colon = o->owner.find(':');
        const std::string user = o->owner.substr(0, colon);
        if (!user.empty()) {
          UB_ASSIGN_OR_RETURN(c.uid, ParseId(user, false, o->owner));
        }
        if (colon != std::string::npos && colon + 1 < o->owner.size()) {
          UB_ASSIGN_OR_RETURN(c.gid, ParseId(o->owner.substr(colon + 1), true, o->owner));
        }
        for (const auto& path : p) {
          UB_ASSIGN_OR_RETURN(InodeId id, Find(fs, path, "cannot access"));
          UB_RETURN_IF_ERROR(fs.SetAttr(id, c));
        }
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      bool no_create = false, atime_only = false, mtime_only = false;
      std::string date;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* touch = app.add_subcommand("touch", "Set file times to now or -d DATE, creating missing files (" + P + "...)");
    touch->add_flag("-c,--no-create", o->no_create, "Do not create missing files");
    touch->add_flag("-a", o->atime_only, "Change only the access time");
    touch->add_flag("-m", o->mtime_only, "Change only the modification time");
    touch->add_option("-d,--date", o->date, "@SECONDS[.N], now, or YYYY-MM-DD[ HH:MM[:SS[.N]]] (local time)");
    touch->add_option("files", o->files, P)->required();
    touch->callback([=] {
      Run(session, "touch", true, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        UB_ASSIGN_OR_RETURN(Time t, ParseDate(o->date.empty() ? "now" : o->date));
        for (const auto& path : p) {
          auto id = OpenOrCreate(fs, path, !o->no_create);
          if (!id.ok()) {
            if (o->no_create && id.status().code() == ENOENT) continue;
            return Err(id.status().code(), "cannot touch " + Q(path) + ": " + strerror(id.status().code()));
          }
          AttrChange c;
          if (!o->mtime_only) c.atime = t;
          if (!o->atime_only) c.mtime = t;
          UB_RETURN_IF_ERROR(fs.SetAttr(*id, c));
        }
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      std::string size;
      bool no_create = false;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* tr = app.add_subcommand("truncate", "Shrink or extend files to a size (-s SIZE " + P + "...)");
    tr->add_option("-s,--size", o->size, "[+-]N[K|M|G|T][iB|B]; K = 1024, KB = 1000")->required();
    tr->add_flag("-c,--no-create", o->no_create, "Do not create missing files");
    tr->add_option("files", o->files, P)->required();
    tr->callback([=] {
      Run(session, "truncate", true, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        UB_ASSIGN_OR_RETURN(auto sz, ParseSize(o->size));
        for (const auto& path : p) {
          auto id = OpenOrCreate(fs, path, !o->no_create);
          if (!id.ok()) {
            if (o->no_create && id.status().code() == ENOENT) continue;
            return Err(id.status().code(), "cannot open " + Q(path) + " for writing: " + strerror(id.status().code()));
          }
          UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(*id));
          if (S_ISDIR(st.mode)) return Err(EISDIR, "cannot open " + Q(path) + " for writing: Is a directory");
          uint64_t n = sz.second;
          if (sz.first == '+') n = st.size + n;
          if (sz.first == '-') n = st.size > n ? st.size - n : 0;
          UB_RETURN_IF_ERROR(fs.SetAttr(*id, AttrChange{.size = n}));
        }
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      std::string name, value, remove;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* sf = app.add_subcommand("setfattr", "Set (-n NAME -v VALUE) or remove (-x NAME) an xattr (" + P + "...)");
    sf->add_option("-n,--name", o->name, "Attribute name (user.x, trusted.x, ...)");
    sf->add_option("-v,--value", o->value, "Value: text, \"text\", 0x<hex> or 0s<base64>");
    sf->add_option("-x,--remove", o->remove, "Remove this attribute");
    sf->add_option("files", o->files, P)->required();
    sf->callback([=] {
      Run(session, "setfattr", true, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        if (o->name.empty() == o->remove.empty()) return Err(EINVAL, "give exactly one of -n and -x");
        std::string value;
        if (!o->name.empty()) {
          UB_ASSIGN_OR_RETURN(value, DecodeValue(o->value));
        }
        for (const auto& path : p) {
          UB_ASSIGN_OR_RETURN(InodeId id, FindAttr(fs, path));
          Status st = o->remove.empty() ? fs.SetXattr(id, o->name, value) : fs.RemoveXattr(id, o->remove);
          if (!st.ok()) return Err(st.code(), Printable(path) + ": " + XattrError(st.code()));
        }
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      std::string name, match = "^user\\.";
      bool dump = false, json = false;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* gf = app.add_subcommand("getfattr", "Print xattrs (" + P + "...)");
    gf->add_option("-n,--name", o->name, "Only this attribute");
    gf->add_flag("-d,--dump", o->dump, "Print values too");
    gf->add_option("-m,--match", o->match, "Names starting with this prefix ('-' for all; default user.)");
    gf->add_flag("--json", o->json, "One JSON object per file");
    gf->add_option("files", o->files, P)->required();
    gf->callback([=] {
      Run(session, "getfattr", false, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        for (const auto& path : p) {
          UB_ASSIGN_OR_RETURN(InodeId id, FindAttr(fs, path));
          std::vector<std::string> names;
          if (!o->name.empty()) {
            names.push_back(o->name);
          } else {
            UB_ASSIGN_OR_RETURN(names, fs.ListXattr(id));
            std::sort(names.begin(), names.end());
            const std::string prefix = o->match == "^user\\." ? "user." : o->match == "-" ? "" : o->match;
            std::erase_if(names, [&](const std::string& n) { return !n.starts_with(prefix); });
          }
          std::string json;
          std::vector<std::pair<std::string, std::string>> out;
          for (const auto& n : names) {
            auto v = fs.GetXattr(id, n);
            if (!v.ok()) {
              if (!o->name.empty()) {
                return Err(v.status().code(), Printable(path) + ": " + n + ": " + XattrError(v.status().code()));
              }
              continue;
            }
            out.emplace_back(n, *v);
          }
          if (o->json) {
            std::string fields;
            for (const auto& [n, v] : out) fields += (fields.empty() ? "" : ", ") + JsonString(n) + ": " + JsonString(v);
            fmt::print("{{\"file\": {}, \"xattrs\": {{{}}}}}\n", JsonString(path), fields);
          } else if (!out.empty()) {
            fmt::print("# file: {}\n", Printable(path.starts_with('/') ? path.substr(1) : path));
            for (const auto& [n, v] : out) {
              if (o->dump || !o->name.empty()) fmt::print("{}={}\n", n, EncodeValue(v));
              else fmt::print("{}\n", n);
            }
            fmt::print("\n");
          }
        }
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      bool json = false;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* stat = app.add_subcommand("stat", "Show an inode's attributes (" + P + "...)");
    stat->add_flag("--json", o->json, "One JSON object per file");
    stat->add_option("files", o->files, P)->required();
    stat->callback([=] {
      Run(session, "stat", false, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        for (const auto& path : p) UB_RETURN_IF_ERROR(StatOne(fs, path, o->json));
        return Status::Ok();
      });
    });
  }

  {
    // find's own single-dash options do not fit an option parser: the
    // arguments are taken as they come.
    auto args = std::make_shared<Paths>();
    auto* find = app.add_subcommand("find", "List a tree (" + P + " [-name GLOB] [-type f|d|l|c|b|p|s] [-maxdepth N] [-mindepth N])");
    find->allow_extras();
    find->prefix_command();
    find->callback([=, find = find] {
      const auto rest = find->remaining();
      FindSpec spec;
      Paths starts;
      for (size_t i = 0; i < rest.size(); ++i) {
        const std::string& a = rest[i];
        auto value = [&]() -> const std::string* { return i + 1 < rest.size() ? &rest[++i] : nullptr; };
        if (a == "-name" || a == "-type" || a == "-maxdepth" || a == "-mindepth") {
          const std::string* v = value();
          if (v == nullptr) {
            fmt::print(stderr, "ubtrfs: find: missing argument to '{}'\n", a);
            if (session) session->status = Err(EINVAL, "find: missing argument to '" + a + "'");
            return SetExitCode(2);
          }
          if (a == "-name") spec.name = *v;
          else if (a == "-type") spec.type = v->empty() ? '?' : (*v)[0];
          else if (a == "-maxdepth") spec.maxdepth = std::atoi(v->c_str());
          else spec.mindepth = std::atoi(v->c_str());
        } else if (a.starts_with("-")) {
          fmt::print(stderr, "ubtrfs: find: unknown predicate '{}'\n", a);
          if (session) session->status = Err(EINVAL, "find: unknown predicate '" + a + "'");
          return SetExitCode(2);
        } else {
          starts.push_back(a);
        }
      }
      if (starts.empty() && session != nullptr) starts.push_back("/");
      if (starts.empty()) {
        fmt::print(stderr, "ubtrfs: find: expected IMAGE:PATH\n");
        return SetExitCode(2);
      }
      Run(session, "find", false, starts, [=](Filesystem& fs, const Paths& p) -> Status {
        WalkErrors errors("find");
        for (const auto& start : p) {
          auto id = fs.Lookup(start);
          if (!id.ok()) return Err(id.status().code(), Q(start) + ": " + strerror(id.status().code()));
          std::set<std::pair<uint64_t, uint64_t>> dirs;
          std::string name = SplitLast(start).second;
          FindWalk(fs, *id, start, name, 0, spec, dirs, errors);
        }
        return errors.Done();
      });
    });
  }

  {
    struct O {
      DuSpec spec;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* du = app.add_subcommand("du", "Space used by files and directories (" + P + "...)");
    du->set_help_flag("--help", "Print this help message and exit");  // -h is --human-readable, as du's
    du->add_flag("-s,--summarize", o->spec.summarize, "Only a total for each argument");
    du->add_flag("-a,--all", o->spec.all, "Files too, not only directories");
    du->add_flag("-b,--bytes", o->spec.bytes, "Apparent sizes in bytes");
    du->add_flag("-h,--human-readable", o->spec.human, "Sizes as 1.5K, 23M, ...");
    du->add_flag("--json", o->spec.json, "A JSON list of {path, bytes}");
    du->add_option("files", o->files, P)->required();
    du->callback([=] {
      Run(session, "du", false, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        std::string json;
        WalkErrors errors("du");
        for (const auto& path : p) {
          UB_ASSIGN_OR_RETURN(InodeId id, Find(fs, path, "cannot access"));
          std::set<std::pair<uint64_t, uint64_t>> seen;
          DuWalk(fs, id, path, 0, o->spec, seen, &json, errors);
        }
        if (o->spec.json) fmt::print("[{}]\n", json);
        return errors.Done();
      });
    });
  }

  {
    struct O {
      bool json = false, human = false;
      std::string image;
    };
    auto o = std::make_shared<O>();
    auto* df = app.add_subcommand("df", edit ? "Space of the image" : "Space of an image (IMAGE)");
    df->set_help_flag("--help", "Print this help message and exit");
    df->add_flag("--json", o->json, "As a JSON object");
    df->add_flag("-h,--human-readable", o->human, "Sizes as 1.5K, 23M, ...");
    if (!edit) df->add_option("image", o->image, "IMAGE")->required();
    df->callback([=] {
      Paths args;
      if (!edit) args.push_back(o->image.find(':') == std::string::npos ? o->image + ":/" : o->image);
      Run(session, "df", false, args, [=](Filesystem& fs, const Paths&) -> Status {
        // As df(1) prints statfs(2) (what a mount of the image reports): Used
        // is total less free (f_bfree), Available what files can still take
        // (f_bavail), Use% used / (used + available), rounded up.
        UB_ASSIGN_OR_RETURN(FsStat s, fs.StatFs());
        const uint64_t used = s.total_bytes > s.free_bytes ? s.total_bytes - s.free_bytes : 0;
        const std::string name = edit ? "image" : o->image;
        if (o->json) {
          fmt::print("{{\"filesystem\": {}, \"total_bytes\": {}, \"used_bytes\": {}, \"free_bytes\": {}, "
                     "\"avail_bytes\": {}}}\n",
                     JsonString(name), s.total_bytes, used, s.free_bytes, s.avail_bytes);
          return Status::Ok();
        }
        DuSpec h;
        h.human = o->human;
        const uint64_t base = used + s.avail_bytes;
        const int pct = base ? static_cast<int>((used * 100 + base - 1) / base) : 0;
        fmt::print("Filesystem     {:>10} {:>10} {:>10} Use% Mounted on\n", o->human ? "Size" : "1K-blocks", "Used",
                   "Available");
        fmt::print("{:<14} {:>10} {:>10} {:>10} {:>3}% -\n", name, DuSize(s.total_bytes, h), DuSize(used, h),
                   DuSize(s.avail_bytes, h), pct);
        return Status::Ok();
      });
    });
  }

  {
    struct O {
      int level = -1;
      bool all = false;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* tree = app.add_subcommand("tree", "Show a directory tree (" + P + ")");
    tree->add_flag("-a,--all", o->all, "Also list names that start with '.'");
    tree->add_option("-L,--level", o->level, "Descend at most this many levels");
    tree->add_option("files", o->files, P)->required()->expected(1);
    tree->callback([=] {
      Run(session, "tree", false, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        UB_ASSIGN_OR_RETURN(InodeId id, Find(fs, p[0], "cannot access"));
        fmt::print("{}\n", Printable(p[0]));
        UB_ASSIGN_OR_RETURN(Stat top, fs.GetStat(id));
        uint64_t dirs = S_ISDIR(top.mode) ? 1 : 0, files = 0;
        std::set<std::pair<uint64_t, uint64_t>> seen;
        WalkErrors errors("tree");
        TreeWalk(fs, id, p[0], "", 0, o->level, o->all, &dirs, &files, seen, errors);
        fmt::print("\n{} director{}, {} file{}\n", dirs, dirs == 1 ? "y" : "ies", files, files == 1 ? "" : "s");
        return errors.Done();
      });
    });
  }

  {
    struct O {
      bool parents = false;
      std::string mode;  // default: 0777 less the umask, as mkdir(1)
      Paths dirs;
    };
    auto o = std::make_shared<O>();
    auto* mkdir = app.add_subcommand("mkdir", "Create directories (" + P + "...)");
    mkdir->add_flag("-p,--parents", o->parents, "Make parents as needed; no error if existing");
    mkdir->add_option("-m,--mode", o->mode, "Permission bits, octal");
    mkdir->add_option("dirs", o->dirs, P)->required();
    mkdir->callback([=] {
      Run(session, "mkdir", true, o->dirs, [=](Filesystem& fs, const Paths& p) -> Status {
        uint32_t mode = Attrs(0777).mode;
        if (!o->mode.empty()) {
          UB_ASSIGN_OR_RETURN(mode, ParseMode(o->mode, 0777, true));
        }
        for (const auto& path : p) {
          InodeId cur = fs.Root();
          std::string so_far;
          size_t pos = 0;
          while (pos < path.size()) {
            size_t slash = path.find('/', pos);
            std::string comp = path.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
            pos = slash == std::string::npos ? path.size() : slash + 1;
            if (comp.empty() || comp == ".") continue;
            so_far += "/" + comp;
            const bool last = path.find_first_not_of('/', pos) == std::string::npos;
            auto next = fs.LookupChild(cur, comp);
            if (next.ok() && (!last || o->parents)) {
              cur = *next;
              continue;
            }
            if (next.ok()) return Err(EEXIST, "cannot create directory " + Q(path) + ": File exists");
            if (!last && !o->parents) {
              return Err(ENOENT, "cannot create directory " + Q(path) + ": No such file or directory");
            }
            NewInode a = Attrs(0777);
            if (last) a.mode = mode;
            auto made = fs.Mkdir(cur, comp, a);
            if (!made.ok()) return Err(made.status().code(), "cannot create directory " + Q(so_far) + ": " +
                                                                 strerror(made.status().code()));
            cur = *made;
          }
        }
        return Status::Ok();
      });
    });
  }
  {
    struct O {
      bool recursive = false, force = false;
      Paths files;
    };
    auto o = std::make_shared<O>();
    auto* rm = app.add_subcommand("rm", "Remove files, or trees with -r (" + P + "...)");
    rm->add_flag("-r,-R,--recursive", o->recursive, "Remove directories and their contents");
    rm->add_flag("-f,--force", o->force, "Ignore missing files");
    rm->add_option("files", o->files, P)->required();
    rm->callback([=] {
      Run(session, "rm", true, o->files, [=](Filesystem& fs, const Paths& p) -> Status {
        for (const auto& path : p) {
          auto [dp, dn] = SplitLast(path);
          if (dn.empty() || dn == "/" || dn == "." || dn == "..") return Err(EINVAL, "refusing to remove " + Q(path));
          auto dir = fs.Lookup(dp);
          auto id = dir.ok() ? fs.LookupChild(*dir, dn) : Result<InodeId>(dir.status());
          if (!id.ok()) {
            if (o->force) continue;
            return Err(ENOENT, "cannot remove " + Q(path) + ": No such file or directory");
          }
          UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(*id));
          if (S_ISDIR(st.mode) && !o->recursive) return Err(EISDIR, "cannot remove " + Q(path) + ": Is a directory");
          Status r = RemoveTree(fs, *dir, dn);
          if (!r.ok()) return Err(r.code(), "cannot remove " + Q(path) + ": " + r.message());
        }
        return Status::Ok();
      });
    });
  }
  {
    auto files = std::make_shared<Paths>();
    auto* rmdir = app.add_subcommand("rmdir", "Remove empty directories (" + P + "...)");
    rmdir->add_option("dirs", *files, P)->required();
    rmdir->callback([=] {
      Run(session, "rmdir", true, *files, [](Filesystem& fs, const Paths& p) -> Status {
        for (const auto& path : p) {
          auto [dp, dn] = SplitLast(path);
          UB_ASSIGN_OR_RETURN(InodeId dir, Find(fs, dp, "failed to remove"));
          Status r = fs.Rmdir(dir, dn);
          if (!r.ok()) return Err(r.code(), "failed to remove " + Q(path) + ": " + strerror(r.code()));
        }
        return Status::Ok();
      });
    });
  }
  if (!edit) {
    auto files = std::make_shared<Paths>();
    auto* put = app.add_subcommand("put", "Write standard input to a file, creating or replacing its contents (IMAGE:PATH)");
    put->add_option("file", *files, "IMAGE:PATH")->required()->expected(1);
    put->callback([=] {
      Run(session, "put", true, *files, [](Filesystem& fs, const Paths& p) -> Status {
        // Errors as tee(1) gives them for `... | tee PATH`: "PATH: error".
        auto id = OpenOrCreate(fs, p[0], true);
        if (!id.ok()) return Err(id.status().code(), Printable(p[0]) + ": " + strerror(id.status().code()));
        UB_ASSIGN_OR_RETURN(Stat st, fs.GetStat(*id));
        if (S_ISDIR(st.mode)) return Err(EISDIR, Printable(p[0]) + ": " + strerror(EISDIR));
        if (!S_ISREG(st.mode)) return Err(EINVAL, Printable(p[0]) + ": not a regular file");
        return WriteAll(fs, *id, 0);
      });
    });
    return;
  }

  // ---- Edit-session verbs: the top level has these with other arguments
  // (cat IMAGE PATH) or as cp (read_commands.cc, write_commands.cc).
  {
    auto files = std::make_shared<Paths>();
    auto* cat = app.add_subcommand("cat", "Print files (PATH...)");
    cat->add_option("files", *files, "PATH")->required();
    cat->callback([=] {
      Run(session, "cat", false, *files, [](Filesystem& fs, const Paths& p) -> Status {
        std::vector<uint8_t> buf(1 << 20);
        for (const auto& path : p) {
          // As cat(1): "PATH: error".
          auto id = fs.Lookup(path);
          if (!id.ok()) return Err(id.status().code(), Printable(path) + ": " + strerror(id.status().code()));
          for (uint64_t off = 0;;) {
            auto n = fs.Read(*id, off, buf);
            if (!n.ok()) return Err(n.status().code(), Printable(path) + ": " + strerror(n.status().code()));
            if (*n == 0) break;
            std::fwrite(buf.data(), 1, *n, stdout);
            off += *n;
          }
        }
        std::fflush(stdout);
        return Status::Ok();
      });
    });
  }
  {
    struct O {
      bool long_format = false, json = false;
      Paths paths;
    };
    auto o = std::make_shared<O>();
    auto* ls = app.add_subcommand("ls", "List directories (PATH..., default /)");
    ls->add_flag("-l", o->long_format, "Long listing: mode, links, owner, size, time");
    ls->add_flag("--json", o->json, "As JSON");
    ls->add_option("paths", o->paths, "PATH");
    ls->callback([=] {
      Paths p = o->paths.empty() ? Paths{"/"} : o->paths;
      Run(session, "ls", false, p, [=](Filesystem& fs, const Paths& paths) -> Status {
        for (const auto& path : paths) {
          Status st = ListPath(fs, path, o->long_format, o->json);
          if (!st.ok()) {
            return Err(st.code(), "cannot access " + Q(path) + ": " + strerror(st.code()));
          }
        }
        return Status::Ok();
      });
    });
  }
  {
    struct O {
      std::string host, path;
    };
    auto o = std::make_shared<O>();
    auto* ci = app.add_subcommand("copy-in", "Copy a host file or tree into the image (HOST PATH)");
    ci->add_option("host", o->host, "Host path")->required();
    ci->add_option("path", o->path, "PATH in the image (an existing directory: copied into it)")->required();
    ci->callback([=] {
      Run(session, "copy-in", true, {o->path}, [=](Filesystem& fs, const Paths& p) -> Status {
        UB_ASSIGN_OR_RETURN(auto where, CopyInTarget(fs, o->host, p[0]));
        return ImportTree(fs, o->host, where.first, where.second, ImportOptions{}, nullptr);
      });
    });
  }
  {
    struct O {
      std::string path, host;
    };
    auto o = std::make_shared<O>();
    auto* co = app.add_subcommand("copy-out", "Copy a file or tree out of the image (PATH HOST)");
    co->add_option("path", o->path, "PATH in the image")->required();
    co->add_option("host", o->host, "Host path")->required();
    co->callback([=] {
      Run(session, "copy-out", false, {o->path}, [=](Filesystem& fs, const Paths& p) -> Status {
        UB_ASSIGN_OR_RETURN(InodeId id, Find(fs, p[0], "cannot access"));
        ExportOptions opts;
        opts.on_message = [](bool error, std::string_view m) {
          fmt::print(stderr, "ubtrfs: {}{}\n", error ? "" : "warning: ", m);
        };
        return ExportTree(fs, id, p[0], o->host, opts);
      });
    });
  }
}

}  // namespace ubtrfs::cli
