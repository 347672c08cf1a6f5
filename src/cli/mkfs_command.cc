// mkfs: create an empty btrfs filesystem in an image file (created or
// extended to --size) or on a block device, like mkfs.btrfs.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/mkfs_rootdir.h"
#include "format/checksum.h"
#include "format/superblock.h"
#include "ubtrfs/import.h"
#include "io/block_device.h"
#include "io/offset_device.h"
#include "io/rbd_device.h"
#include "alloc/chunk_map.h"
#include "txn/clock.h"
#include "txn/mkfs.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/resize.h"

namespace ubtrfs::cli {
namespace {

struct MkfsArgs {
  std::vector<std::string> images;
  std::string data_profile;
  std::string metadata_profile;
  std::string size;
  std::string nodesize = "16384";
  bool nodesize_given = false;  // --mixed takes the sector size unless -n is given
  std::string sectorsize = "4096";
  std::string csum = "crc32c";
  std::string label;
  std::string uuid;
  std::string rootdir;
  std::string compress;
  std::vector<std::string> features;
  std::vector<std::string> subvols;      // [rw|ro|default|default-ro:]SUBDIR
  std::vector<std::string> inode_flags;  // nodatacow|nodatasum[,...]:PATH
  std::string owner;                     // UID:GID
  bool deterministic = false;
  bool mixed = false;
  bool shrink = false;
  bool reflink = false;
  bool force = false;
  bool nodiscard = false;  // accepted only: ubtrfs mkfs never discards
  bool quiet = false;
};

// mkfs --shrink builds in a sparse file of this size, then cuts it.
constexpr uint64_t kShrinkBuildBytes = 1ull << 40;

void Fail(const std::string& msg) {
  fmt::print(stderr, "ubtrfs mkfs: {}\n", msg);
  SetExitCode(1);
}

// "65536", "64k", "64K", "512M", "512MiB", "1G", "2T": bytes (binary units).
std::optional<uint64_t> ParseSize(std::string_view s) {
  uint64_t v = 0;
  if (!ParseByteSize(s, &v).ok()) return std::nullopt;
  return v;
}

// Whether `path` (an image file or a block device) is mounted: a mount
// source that names it, or a loop device backed by it.
bool IsMounted(const std::string& path) {
  char* real = ::realpath(path.c_str(), nullptr);
  if (!real) return false;
  const std::string target = real;
  std::free(real);
  std::ifstream mounts("/proc/self/mounts");
  std::string line;
  while (std::getline(mounts, line)) {
    const std::string source = line.substr(0, line.find(' '));
    if (source == target) return true;
    if (source.rfind("/dev/loop", 0) == 0) {
      std::ifstream backing("/sys/block/" + source.substr(5) + "/loop/backing_file");
      std::string file;
      if (std::getline(backing, file) && file == target) return true;
    }
  }
  return false;
}

// -O as mkfs.btrfs: a comma-separated list, ^ turning a feature off. The
// features every image we make has cannot be turned off; the others we do
// not write are refused by name.
Status ApplyFeatures(const std::vector<std::string>& lists, txn::MkfsOptions* opts) {
  // Under btrfs-progs' names and the superblock's.
  static const std::vector<std::string> kAlways = {"mixed-bg-backref", "mixed-backref", "extref", "extended-iref",
                                                   "skinny-metadata", "no-holes",      "free-space-tree", "fst"};
  for (const std::string& list : lists) {
    size_t pos = 0;
    while (pos <= list.size()) {
      const size_t comma = std::min(list.find(',', pos), list.size());
      std::string f = list.substr(pos, comma - pos);
      pos = comma + 1;
      if (f.empty()) continue;
      const bool off = f[0] == '^';
      if (off) f.erase(0, 1);
      if (f == "block-group-tree" || f == "block_group_tree") {
        opts->block_group_tree = !off;
      } else if (f == "mixed-bg" || f == "mixed-groups") {
        opts->mixed = !off;
      } else if (std::find(kAlways.begin(), kAlways.end(), f) != kAlways.end()) {
        if (off) return Status::Invalid("feature " + f + " cannot be turned off: ubtrfs always writes it");
      } else {
        return Status::Invalid("unknown or unsupported feature '" + f +
                               "' (supported: block-group-tree, mixed-bg, and ^ before either to turn it off)");
      }
    }
  }
  return Status::Ok();
}

std::string JoinImages(const std::vector<std::string>& images) {
  std::string out;
  for (const auto& i : images) out += (out.empty() ? "" : ",") + i;
  return out;
}

void CmdMkfs(const MkfsArgs& a) {
  txn::MkfsOptions opts;
  const std::string& image = a.images.front();
  if (Status st = ApplyFeatures(a.features, &opts); !st.ok()) return Fail("invalid -O: " + st.message());
  if (a.mixed) opts.mixed = true;
  for (auto [flag, text, field] : {std::tuple{"-d", &a.data_profile, &opts.data_profile},
                                   std::tuple{"-m", &a.metadata_profile, &opts.metadata_profile}}) {
    if (text->empty()) continue;
    *field = txn::ParseProfile(*text);
    if (!*field) {
      return Fail(std::string("invalid ") + flag + " '" + *text +
                  "': unknown profile (single, dup, raid0, raid1, raid1c3, raid1c4, raid10)");
    }
  }
  if (Status st = txn::ValidateMkfsProfiles(opts, a.images.size()); !st.ok()) return Fail(st.message());
  if (a.images.size() > 1 && a.shrink) return Fail("--shrink makes one image file; it cannot go with several devices");
  if (a.images.size() > 1 && a.reflink) {
    return Fail("--reflink clones host files into one image file; it cannot go with several devices");
  }
  auto nodesize = ParseSize(a.nodesize);
  if (!nodesize || *nodesize > UINT32_MAX) return Fail("invalid --nodesize '" + a.nodesize + "': not a size");
  opts.nodesize = static_cast<uint32_t>(*nodesize);
  auto sectorsize = ParseSize(a.sectorsize);
  if (!sectorsize || *sectorsize > UINT32_MAX) return Fail("invalid --sectorsize '" + a.sectorsize + "': not a size");
  opts.sectorsize = static_cast<uint32_t>(*sectorsize);
  auto csum = format::CsumTypeFromName(a.csum);
  if (!csum) return Fail("invalid --csum '" + a.csum + "': choose crc32c, xxhash, sha256 or blake2");
  opts.csum_type = *csum;
  opts.label = a.label;
  if (opts.mixed && !a.nodesize_given) opts.nodesize = opts.sectorsize;  // as mkfs.btrfs -M
  if (!a.uuid.empty()) {
    opts.fsid = txn::ParseUuid(a.uuid);
    if (!opts.fsid) return Fail("invalid --uuid '" + a.uuid + "': expected the form 01234567-89ab-cdef-0123-456789abcdef");
  }
  // Byte-identical images: uuids from a seed (-U, or the epoch and label), the
  // library's clock fixed at SOURCE_DATE_EPOCH (0 without it), imported
  // times clamped to it.
  std::optional<Time> max_time;
  if (const char* sde = std::getenv("SOURCE_DATE_EPOCH"); a.deterministic || (sde && *sde)) {
    int64_t epoch = 0;
    if (sde && *sde) {
      const std::string_view v(sde);
      auto n = ParseSize(v);
      if (!n || v.find_first_not_of("0123456789") != std::string_view::npos || *n > uint64_t{INT64_MAX}) {
        return Fail(std::string("SOURCE_DATE_EPOCH '") + sde + "' is not a number of seconds since 1970");
      }
      epoch = static_cast<int64_t>(*n);
    }
    std::array<uint8_t, 16> seed{};
    if (opts.fsid) {
      std::copy(opts.fsid->begin(), opts.fsid->end(), seed.begin());
    } else {
      // The epoch and the label: images told apart by their labels get
      // different uuids (-U for anything else).
      seed = txn::SeedFromText("ubtrfs mkfs\n" + std::to_string(epoch) + "\n" + opts.label);
      opts.fsid.emplace();
      const auto u = txn::DeriveUuid(seed, 1);
      std::copy(u.begin(), u.end(), opts.fsid->begin());
    }
    int purpose = 2;
    for (auto* field : {&opts.dev_uuid, &opts.chunk_tree_uuid, &opts.fs_tree_uuid}) {
      const auto u = txn::DeriveUuid(seed, static_cast<uint64_t>(purpose++));
      field->emplace();
      std::copy(u.begin(), u.end(), (*field)->begin());
    }
    for (size_t i = 1; i < a.images.size(); ++i) {
      const auto u = txn::DeriveUuid(seed, 100 + i);
      opts.more_dev_uuids.emplace_back();
      std::copy(u.begin(), u.end(), opts.more_dev_uuids.back().begin());
    }
    opts.time_sec = epoch;
    opts.time_nsec = 0;
    txn::SetDeterministic(epoch, seed);
    max_time = Time{epoch, 0};
  }
  std::optional<uint64_t> size;
  if (!a.size.empty()) {
    size = ParseSize(a.size);
    if (!size) return Fail("invalid --size '" + a.size + "': not a size (e.g. 1073741824, 512M, 1G)");
    opts.total_bytes = *size;
  }
  if (a.shrink) {
    if (a.rootdir.empty()) return Fail("--shrink needs --rootdir (it makes the image as small as what is imported)");
    if (Placement().offset != 0 || Placement().partition != 0) {
      return Fail("--shrink makes an image file; it cannot go with --offset or --partition");
    }
    struct stat ist;
    if (io::IsRbdPath(image) || (::stat(image.c_str(), &ist) == 0 && !S_ISREG(ist.st_mode))) {
      return Fail("--shrink needs an image file (" + image + " is not a regular file)");
    }
    // Built in a large sparse file (what --size gives, else 1 TiB: data
    // chunks fill it from the start, the metadata chunk waits at the end),
    // then cut to fit.
    if (!size) {
      size = kShrinkBuildBytes;
      opts.total_bytes = *size;
    }
    // Mixed chunks hold both kinds: no layout to choose, the trim and
    // compaction below cut them to what they hold.
    if (!opts.mixed) {
      opts.metadata_at_end = true;
      if (*size >= (64ull << 30)) opts.metadata_chunk_bytes = 1ull << 30;
    }
  }
  if (Status st = txn::ValidateMkfsOptions(opts); !st.ok()) {
    std::string msg = st.message();
    if (msg.rfind("nodesize", 0) == 0) msg = "invalid --nodesize: " + msg;
    else if (msg.rfind("sectorsize", 0) == 0) msg = "invalid --sectorsize: " + msg;
    else if (msg.rfind("label", 0) == 0) msg = "invalid --label: " + msg;
    else if (msg.rfind("filesystem size", 0) == 0) msg = "invalid --size: " + msg;
    return Fail(msg);
  }

  CompressOptions compress;
  if (!a.compress.empty()) {
    if (a.rootdir.empty()) return Fail("--compress needs --rootdir (it compresses the data copied in)");
    if (Status c = ParseCompressSpec(a.compress, &compress); !c.ok()) return Fail("--compress: " + c.message());
  }
  if (a.rootdir.empty() && !a.subvols.empty()) return Fail("--subvol needs --rootdir (it names a directory in it)");
  if (a.rootdir.empty() && !a.inode_flags.empty()) {
    return Fail("--inode-flags needs --rootdir (it names a path in it)");
  }
  std::vector<SubvolSpec> subvols;
  std::map<std::string, uint32_t> inode_flags;
  std::string root_real;
  std::optional<std::pair<uint32_t, uint32_t>> owner;
  if (!a.owner.empty()) {
    if (a.rootdir.empty()) return Fail("--owner needs --rootdir (it sets the owner of what is imported)");
    const size_t colon = a.owner.find(':');
    auto num = [](std::string_view v) -> std::optional<uint32_t> {
      auto n = ParseSize(v);
      if (!n || v.empty() || v.find_first_not_of("0123456789") != std::string_view::npos || *n > UINT32_MAX - 1) {
        return std::nullopt;
      }
      return static_cast<uint32_t>(*n);
    };
    std::optional<uint32_t> uid, gid;
    if (colon != std::string::npos) {
      uid = num(std::string_view(a.owner).substr(0, colon));
      gid = num(std::string_view(a.owner).substr(colon + 1));
    }
    if (!uid || !gid) return Fail("invalid --owner '" + a.owner + "': expected UID:GID (numbers, e.g. 0:0)");
    owner.emplace(*uid, *gid);
  }
  // --rootdir: a directory, or a tar archive (a file, a pipe; "-": stdin).
  bool archive = false;
  if (!a.rootdir.empty()) {
    struct stat rs;
    if (a.rootdir == "-") {
      archive = true;
    } else {
      if (::stat(a.rootdir.c_str(), &rs) != 0) return Fail("--rootdir " + a.rootdir + ": " + std::strerror(errno));
      if (S_ISREG(rs.st_mode) || S_ISFIFO(rs.st_mode) || S_ISCHR(rs.st_mode)) {
        archive = true;
      } else if (!S_ISDIR(rs.st_mode)) {
        return Fail("--rootdir " + a.rootdir + ": not a directory or a tar archive");
      }
    }
  }
  if (a.reflink && (a.rootdir.empty() || archive)) {
    return Fail("--reflink needs a directory --rootdir (it clones the host files' data into the image file)");
  }
  if (a.reflink && io::IsRbdPath(image)) {
    return Fail("--reflink clones the host files' data into an image file on the same host; not into an RBD image");
  }
  if (a.reflink && !a.compress.empty()) {
    return Fail("--reflink and --compress exclude each other: compressed data is not the host files' bytes");
  }
  if (archive && !a.subvols.empty()) return Fail("--subvol needs a directory --rootdir, not an archive");
  if (archive && !a.inode_flags.empty()) return Fail("--inode-flags needs a directory --rootdir, not an archive");
  if (!a.rootdir.empty() && !archive) {
    char* real = ::realpath(a.rootdir.c_str(), nullptr);
    if (!real) return Fail("--rootdir " + a.rootdir + ": " + std::strerror(errno));
    root_real = real;
    std::free(real);
    std::string err;
    auto sv = ParseSubvols(a.subvols, root_real, &err);
    if (!sv) return Fail(err);
    subvols = std::move(*sv);
    auto fl = ParseInodeFlags(a.inode_flags, root_real, &err);
    if (!fl) return Fail(err);
    inode_flags = std::move(*fl);
  }

  io::Placement where;
  where.offset = Placement().offset;
  where.partition = Placement().partition;
  const bool windowed = where.offset != 0 || where.partition != 0;
  // Every image is checked before any is created or written.
  struct Target {
    std::string path;
    bool rbd = false;
    bool exists = false;
    struct stat st {};
    bool created = false;
  };
  std::vector<Target> targets;
  for (const std::string& image : a.images) {
    for (const Target& t : targets) {
      if (t.path == image) return Fail(image + " is named twice");
    }
    Target t;
    t.path = image;
    // What is there now: nothing, a regular file or a block device; or, for
    // rbd:POOL/IMAGE, an RBD image or none.
    t.rbd = io::IsRbdPath(image);
    struct stat& st = t.st;
    if (t.rbd) {
      auto have = io::RbdImageSize(image);
      if (!have.ok()) return Fail(have.status().message());
      t.exists = have->has_value();
      if (t.exists) {
        st.st_mode = S_IFBLK;  // fixed size, like a block device, unless --size grows it below
        st.st_size = static_cast<off_t>(**have);
      }
    } else {
      t.exists = ::stat(image.c_str(), &st) == 0;
      if (!t.exists && errno != ENOENT) return Fail(image + ": " + std::strerror(errno));
    }
    if (t.exists && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
      return Fail(image + ": not a regular file or block device");
    }
    if (windowed && (!t.exists || size)) {
      return Fail("--offset and --partition make the filesystem inside an existing image, of the window's size "
                  "(no --size)");
    }
    if (!t.exists && !size) {
      return Fail(image + " does not exist; give --size to create " + (t.rbd ? "an RBD image" : "an image file") +
                  " of that size");
    }
    if (t.exists && !t.rbd && IsMounted(image)) return Fail(image + " is mounted; unmount it first");
    if (t.exists) {
      auto dev = io::OpenImage(image, io::OpenFlags{}, where);
      if (!dev.ok()) return Fail(dev.status().message());
      auto has = txn::HasBtrfsSignature(dev->get());
      if (!has.ok()) return Fail(has.status().message());
      if (*has && !a.force) {
        return Fail(image + " already contains a btrfs filesystem; use --force to overwrite it");
      }
      const uint64_t have = (*dev)->Size();
      const uint64_t min = txn::MkfsMinBytes(opts.nodesize);
      if (!size && have < min) {
        return Fail(image + " is too small: " + std::to_string(have) + " bytes (" + Human(have) + "); at least " +
                    std::to_string(min) + " bytes (" + Human(min) + ") are needed with " +
                    std::to_string(opts.nodesize) + "-byte nodes (use --size to extend an image file)");
      }
      if (size && S_ISBLK(st.st_mode) && *size > have && !t.rbd) {
        return Fail("--size " + std::to_string(*size) + " is larger than the device " + image + " (" +
                    std::to_string(have) + " bytes)");
      }
    }
    targets.push_back(std::move(t));
  }

  // Create or extend the image files (or RBD images).
  const auto remove_created = [&] {
    for (Target& t : targets) {
      if (!t.created) continue;
      if (t.rbd) {
        (void)io::RemoveRbdImage(t.path);
      } else {
        ::unlink(t.path.c_str());
      }
      t.created = false;
    }
  };
  for (Target& t : targets) {
    const struct stat& st = t.st;
    if (t.rbd && !t.exists) {
      if (Status c = io::CreateRbdImage(t.path, *size); !c.ok()) {
        remove_created();
        return Fail(c.message());
      }
      t.created = true;
    } else if (t.rbd && size && static_cast<uint64_t>(st.st_size) < *size) {
      if (Status c = io::ResizeRbdImage(t.path, *size); !c.ok()) {
        remove_created();
        return Fail(c.message());
      }
    } else if (!t.exists || (S_ISREG(st.st_mode) && size && static_cast<uint64_t>(st.st_size) < *size)) {
      int fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) {
        const int e = errno;
        remove_created();
        return Fail(t.path + ": cannot create: " + std::strerror(e));
      }
      t.created = !t.exists;
      int r = ::ftruncate(fd, static_cast<off_t>(*size));
      // A host file system whose files cannot be that large: a smaller
      // build file for --shrink.
      while (r != 0 && (errno == EFBIG || errno == EINVAL) && a.shrink && a.size.empty() && *size > (16ull << 30)) {
        *size /= 4;
        opts.total_bytes = *size;
        if (*size < (64ull << 30)) opts.metadata_chunk_bytes = 0;
        r = ::ftruncate(fd, static_cast<off_t>(*size));
      }
      const int e = errno;
      ::close(fd);
      if (r != 0) {
        remove_created();
        return Fail(t.path + ": cannot set the size to " + std::to_string(*size) + " bytes: " + std::strerror(e));
      }
    }
  }

  txn::MkfsSummary sum;
  {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    std::vector<io::BlockDevice*> raw;
    for (const Target& t : targets) {
      auto dev = io::OpenImage(t.path, io::OpenFlags{true}, where);
      if (!dev.ok()) {
        devs.clear();
        remove_created();
        return Fail(dev.status().message());
      }
      raw.push_back(dev->get());
      devs.push_back(std::move(*dev));
    }
    if (Status s = txn::MakeFilesystem(raw, opts, &sum); !s.ok()) {
      devs.clear();
      remove_created();
      return Fail((targets.size() == 1 ? image : std::string("mkfs")) + ": " + s.message());
    }
  }
  const std::string device_list = JoinImages(a.images);

  // --rootdir: the host tree goes in through the library's write API (new
  // chunks are allocated as the data needs them).
  ImportStats stats;
  if (!a.rootdir.empty()) {
    OpenOptions oo;
    oo.writable = true;
    oo.node_cache_bytes = 16ull << 20;  // an import writes through the transaction, not the read cache
    oo.max_dirty_bytes = 32ull << 20;    // peak memory below mkfs.btrfs's on large trees
    oo.compress = compress;
    PlacementInto(&oo);
    auto fs = Filesystem::Open(device_list, oo);
    if (!fs.ok()) return Fail(image + ": reopening for --rootdir: " + fs.status().ToString());
    Status s;
    // Progress only where someone watches: a terminal, and not with -q.
    ProgressLine progress(!a.quiet && ::isatty(STDERR_FILENO));
    if (archive) {
      ImportOptions io;
      io.owner = owner;
      io.max_time = max_time;
      io.progress = [&progress](const ImportStats& st) { progress.Update(st); };
      s = ImportArchive(**fs, a.rootdir, (*fs)->Root(), io, &stats);
    } else {
      s = ImportRootdir(**fs, root_real, subvols, inode_flags, owner, max_time, &progress, &stats, a.reflink);
    }
    if (s.ok()) s = (*fs)->Commit();
    progress.Done();
    if (!s.ok() && archive && std::any_of(targets.begin(), targets.end(), [](const Target& t) { return t.created; })) {
      fs->reset();
      remove_created();
      return Fail("--rootdir: " + s.ToString());
    }
    if (!s.ok()) {
      return Fail(image + ": importing " + a.rootdir + ": " + s.ToString() +
                  " (the filesystem holds what was committed before the error)");
    }
  }
  std::optional<ResizeResult> shrunk;
  if (a.shrink) {
    ResizeResult r;
    if (Status s = ShrinkImageToFit(image, &r); !s.ok()) return Fail(image + ": --shrink: " + s.ToString());
    shrunk = r;
    sum.total_bytes = r.new_bytes;
  }
  if (a.quiet) return;

  fmt::print("Label:              {}\n", opts.label.empty() ? "(null)" : opts.label);
  fmt::print("UUID:               {}\n", format::UuidToString(sum.fsid.data()));
  fmt::print("Node size:          {}\n", opts.nodesize);
  fmt::print("Sector size:        {}\n", opts.sectorsize);
  fmt::print("Filesystem size:    {}\n", Human(sum.total_bytes));
  if (shrunk) fmt::print("Shrunk to:          {} bytes ({})\n", shrunk->new_bytes, Human(shrunk->new_bytes));
  // The chunks as they are now (--rootdir may have added data chunks).
  std::vector<txn::MkfsChunk> chunks = sum.chunks;
  {
    std::vector<std::unique_ptr<io::BlockDevice>> rdevs;
    for (const Target& t : targets) {
      if (auto rdev = io::OpenImage(t.path, io::OpenFlags{}, where); rdev.ok()) rdevs.push_back(std::move(*rdev));
    }
    if (rdevs.size() == targets.size()) {
      if (auto vol = txn::Volume::Open(std::move(rdevs), {}); vol.ok()) {
        chunks.clear();
        for (const auto& [logical, c] : (*vol)->chunks().chunks()) {
          chunks.push_back({logical, c.length, c.type, {}, {}, 0});
        }
      }
    }
  }
  fmt::print("Block group profiles:\n");
  auto profile_line = [&](const char* name, uint64_t kind) {
    uint64_t bytes = 0, type = 0;
    int n = 0;
    for (const auto& c : chunks) {
      if (c.type & kind) {
        bytes += c.length;
        type = c.type;
        ++n;
      }
    }
    if (bytes) {
      fmt::print("  {:<17} {:<16} {:>10}{}\n", name, alloc::ProfileName(type), Human(bytes),
                 n > 1 ? fmt::format(" ({} chunks)", n) : "");
    }
  };
  if (opts.mixed) {
    profile_line("Data+Metadata:", format::kBlockGroupData | format::kBlockGroupMetadata);
  } else {
    profile_line("Data:", format::kBlockGroupData);
    profile_line("Metadata:", format::kBlockGroupMetadata);
  }
  profile_line("System:", format::kBlockGroupSystem);
  fmt::print("Features:           mixed-backref, extended-iref, skinny-metadata, no-holes, free-space-tree{}{}\n",
             opts.mixed ? ", mixed-bg" : "", opts.block_group_tree ? ", block-group-tree" : "");
  fmt::print("Checksum:           {}\n", format::CsumTypeName(opts.csum_type));
  fmt::print("Superblock copies:  {}\n", sum.superblock_copies);
  if (targets.size() > 1) {
    fmt::print("Number of devices:  {}\n", targets.size());
    fmt::print("Devices:\n   ID        SIZE  PATH\n");
    for (size_t i = 0; i < targets.size(); ++i) {
      fmt::print("  {:>3}  {:>10}  {}\n", i + 1, Human(sum.dev_bytes[i]), targets[i].path);
    }
  }
  if (!a.rootdir.empty()) {
    fmt::print("Rootdir:            {}: {} files, {} directories, {} symlinks, {} hard links, {} special files, {}\n",
               a.rootdir, stats.files, stats.dirs, stats.symlinks, stats.hardlinks, stats.specials,
               Human(stats.bytes));
    if (a.reflink) {
      fmt::print("  reflink:          {} shared with the host files, {} copied by the kernel, {} written\n",
                 Human(stats.reflinked_bytes), Human(stats.kernel_copied_bytes),
                 Human(stats.bytes - std::min(stats.bytes, stats.reflinked_bytes + stats.kernel_copied_bytes)));
    }
    for (const auto& sv : subvols) {
      fmt::print("  subvolume:        {} ({}{})\n", sv.rel, sv.read_only ? "ro" : "rw", sv.is_default ? ", default" : "");
    }
  }
}

}  // namespace

void AddMkfsOptions(CLI::App* cmd) {
  static MkfsArgs args;
  cmd->add_option("image", args.images,
                  "Image files (created with --size if missing) or block devices: several make one filesystem "
                  "over all of them (devids 1, 2, ... in this order)")
      ->required();
  cmd->add_option("-d,--data", args.data_profile,
                  "Data profile: single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5 or raid6 (default single)");
  cmd->add_option("-m,--metadata", args.metadata_profile,
                  "Metadata (and system) profile: single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5 or "
                  "raid6 (default dup on one device, raid1 on several)");
  cmd->add_option("-b,--size", args.size,
                  "Filesystem size (bytes, or with a K/M/G/T suffix); a smaller image file is extended to it "
                  "(with several images: each one's size)");
  cmd->add_option("-n,--nodesize", args.nodesize, "Tree block size: 4096..65536, a power of two (--mixed: 4096)")
      ->capture_default_str()
      ->each([](const std::string&) { args.nodesize_given = true; });
  cmd->add_flag("-M,--mixed", args.mixed,
                "Mixed block groups: data and metadata share chunks (small filesystems; node size 4096)");
  cmd->add_option("-s,--sectorsize", args.sectorsize, "Sector size (only 4096)")->capture_default_str();
  cmd->add_option("--csum,--checksum", args.csum, "Checksum: crc32c, xxhash, sha256 or blake2")
      ->capture_default_str();
  cmd->add_option("-L,--label", args.label, "Filesystem label (at most 255 bytes)");
  cmd->add_option("-U,--uuid", args.uuid, "Filesystem UUID (random by default)");
  cmd->add_option("-r,--rootdir", args.rootdir,
                  "Copy this host directory's contents, or a tar archive's (plain, gzip, xz, zstd...; - for "
                  "stdin), into the new filesystem (owners, modes, times, xattrs, hard links, special files)");
  cmd->add_option("--owner", args.owner, "Make UID:GID the owner of everything the --rootdir import makes");
  cmd->add_option("--compress", args.compress,
                  "Compress the --rootdir data with zlib, lzo or zstd (ALG[:LEVEL]), as mount -o compress=");
  cmd->add_option("-O,--features", args.features,
                  "Features, comma-separated, ^ to turn one off, as mkfs.btrfs: block-group-tree is on by default "
                  "(-O ^block-group-tree for kernels older than 6.1)");
  cmd->add_option("-u,--subvol", args.subvols,
                  "Make this directory of the --rootdir a subvolume ([rw|ro|default|default-ro:]SUBDIR, "
                  "repeatable): ro read-only, default the default subvolume")
      ->allow_extra_args(false);
  cmd->add_option("--inode-flags", args.inode_flags,
                  "Set inode flags on this path of the --rootdir (nodatacow|nodatasum[,...]:PATH, repeatable), "
                  "inherited by what is below a directory; such files get no checksums")
      ->allow_extra_args(false);
  cmd->add_flag("--deterministic", args.deterministic,
                "The same input gives the same image bytes: uuids from -U or a fixed seed, the filesystem's own "
                "times and imported times clamped to SOURCE_DATE_EPOCH (0 if unset); also on with SOURCE_DATE_EPOCH");
  cmd->add_flag("--reflink", args.reflink,
                "With a directory --rootdir: clone file data from the host files into the image file (FICLONERANGE, "
                "shared extents) where the file system under both can, else copy it in the kernel");
  cmd->add_flag("--shrink", args.shrink,
                "With --rootdir: the smallest image that holds the tree (chunks cut to what they hold, the image "
                "file cut at the end of the last one); the size is reported");
  // mkfs.btrfs trims the device first; ubtrfs never discards, so there is
  // nothing to turn off. Accepted because callers of mkfs.btrfs pass it
  // (systemd-repart does when discarding is off).
  cmd->add_flag("-K,--nodiscard", args.nodiscard, "Accepted as mkfs.btrfs's; ubtrfs mkfs never discards");
  cmd->add_flag("-f,--force", args.force, "Overwrite an existing btrfs filesystem");
  cmd->add_flag("-q,--quiet", args.quiet, "Print nothing on success");
  cmd->callback([] { CmdMkfs(args); });
}

void RegisterMkfs(CLI::App& app) {
  AddMkfsOptions(app.add_subcommand("mkfs", "Create an empty btrfs filesystem in an image file or on a block device"));
}

}  // namespace ubtrfs::cli
