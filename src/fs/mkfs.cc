// Mkfs (include/ubtrfs/mkfs.h): the whole of `ubtrfs mkfs` and
// mkfs.ubtrfs around txn/mkfs.cc, which writes the filesystem's first
// trees: the images checked, created or extended, the filesystem made,
// the rootdir imported (fs/rootdir_import.cc, or an archive), the image
// shrunk. The messages name the command-line options, as callers of the
// library pass the same values.
#include "ubtrfs/mkfs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>

#include "alloc/chunk_map.h"
#include "format/checksum.h"
#include "format/superblock.h"
#include "fs/rootdir_import.h"
#include "io/block_device.h"
#include "io/mounted.h"
#include "io/offset_device.h"
#include "io/rbd_device.h"
#include "txn/clock.h"
#include "txn/mkfs.h"
#include "txn/volume.h"
#include "ubtrfs/filesystem.h"
#include "ubtrfs/resize.h"

namespace ubtrfs {
namespace {

// --shrink builds in a sparse file of this size, then cuts it.
constexpr uint64_t kShrinkBuildBytes = 1ull << 40;

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

// Byte-identical images: uuids from a seed (the given uuid, or the epoch
// and label), the library's clock fixed at the epoch; returns the time
// imported times are clamped to.
Time MakeDeterministic(int64_t epoch, size_t devices, txn::MkfsOptions* opts) {
  std::array<uint8_t, 16> seed{};
  if (opts->fsid) {
    std::copy(opts->fsid->begin(), opts->fsid->end(), seed.begin());
  } else {
    // The epoch and the label: images told apart by their labels get
    // different uuids (a given uuid for anything else).
    seed = txn::SeedFromText("ubtrfs mkfs\n" + std::to_string(epoch) + "\n" + opts->label);
    opts->fsid.emplace();
    const auto u = txn::DeriveUuid(seed, 1);
    std::copy(u.begin(), u.end(), opts->fsid->begin());
  }
  int purpose = 2;
  for (auto* field : {&opts->dev_uuid, &opts->chunk_tree_uuid, &opts->fs_tree_uuid}) {
    const auto u = txn::DeriveUuid(seed, static_cast<uint64_t>(purpose++));
    field->emplace();
    std::copy(u.begin(), u.end(), (*field)->begin());
  }
  for (size_t i = 1; i < devices; ++i) {
    const auto u = txn::DeriveUuid(seed, 100 + i);
    opts->more_dev_uuids.emplace_back();
    std::copy(u.begin(), u.end(), opts->more_dev_uuids.back().begin());
  }
  opts->time_sec = epoch;
  opts->time_nsec = 0;
  txn::SetDeterministic(epoch, seed);
  return Time{epoch, 0};
}

// One image to make the filesystem on: what is there before, and whether
// this call created it (then a failure removes it again).
struct Target {
  std::string path;
  bool rbd = false;
  bool exists = false;
  struct stat st {};
  bool created = false;
};

void RemoveCreated(std::vector<Target>& targets) {
  for (Target& t : targets) {
    if (!t.created) continue;
    if (t.rbd) {
      (void)io::RemoveRbdImage(t.path);
    } else {
      ::unlink(t.path.c_str());
    }
    t.created = false;
  }
}

// Every image is checked before any is created or written.
// `size` is the size to create or extend to (for --shrink, the build
// file's when none was given).
Status CheckTargets(const MkfsSpec& spec, std::optional<uint64_t> size, const txn::MkfsOptions& opts,
                    const io::Placement& where, std::vector<Target>* targets) {
  const bool windowed = where.offset != 0 || where.partition != 0;
  for (const std::string& image : spec.images) {
    for (const Target& t : *targets) {
      if (t.path == image) return Status::Invalid(image + " is named twice");
    }
    Target t;
    t.path = image;
    // What is there now: nothing, a regular file or a block device; or, for
    // rbd:POOL/IMAGE, an RBD image or none.
    t.rbd = io::IsRbdPath(image);
    struct stat& st = t.st;
    if (t.rbd) {
      auto have = io::RbdImageSize(image);
      if (!have.ok()) return have.status();
      t.exists = have->has_value();
      if (t.exists) {
        st.st_mode = S_IFBLK;  // fixed size, like a block device, unless the size grows it below
        st.st_size = static_cast<off_t>(**have);
      }
    } else {
      t.exists = ::stat(image.c_str(), &st) == 0;
      if (!t.exists && errno != ENOENT) return Status::Error(errno, image + ": " + std::strerror(errno));
    }
    if (t.exists && !S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) {
      return Status::Invalid(image + ": not a regular file or block device");
    }
    if (windowed && (!t.exists || size)) {
      return Status::Invalid(
          "--offset and --partition make the filesystem inside an existing image, of the window's size (no --size)");
    }
    if (!t.exists && !size) {
      return Status::Invalid(image + " does not exist; give --size to create " +
                             (t.rbd ? "an RBD image" : "an image file") + " of that size");
    }
    if (t.exists && !t.rbd && io::MountedByKernel(image)) return Status::Error(EBUSY, image + " is mounted; unmount it first");
    if (t.exists) {
      auto dev = io::OpenImage(image, io::OpenFlags{}, where);
      if (!dev.ok()) return dev.status();
      auto has = txn::HasBtrfsSignature(dev->get());
      if (!has.ok()) return has.status();
      if (*has && !spec.force) {
        return Status::Error(EEXIST, image + " already contains a btrfs filesystem; use --force to overwrite it");
      }
      const uint64_t have = (*dev)->Size();
      const uint64_t min = txn::MkfsMinBytes(opts.nodesize);
      if (!size && have < min) {
        return Status::Invalid(image + " is too small: " + std::to_string(have) + " bytes; at least " +
                               std::to_string(min) + " bytes are needed with " + std::to_string(opts.nodesize) +
                               "-byte nodes (use --size to extend an image file)");
      }
      if (size && S_ISBLK(st.st_mode) && *size > have && !t.rbd) {
        return Status::Invalid("--size " + std::to_string(*size) + " is larger than the device " + image + " (" +
                               std::to_string(have) + " bytes)");
      }
    }
    targets->push_back(std::move(t));
  }
  return Status::Ok();
}

// Creates or extends the image files (or RBD images) to `*size`. A host
// file system whose files cannot be that large gets a smaller build file
// for --shrink (`*size` and `opts` then say what was made).
Status CreateTargets(const MkfsSpec& spec, std::vector<Target>& targets, std::optional<uint64_t>* size,
                     txn::MkfsOptions* opts) {
  for (Target& t : targets) {
    const struct stat& st = t.st;
    if (t.rbd && !t.exists) {
      UB_RETURN_IF_ERROR(io::CreateRbdImage(t.path, **size));
      t.created = true;
    } else if (t.rbd && *size && static_cast<uint64_t>(st.st_size) < **size) {
      UB_RETURN_IF_ERROR(io::ResizeRbdImage(t.path, **size));
    } else if (!t.exists || (S_ISREG(st.st_mode) && *size && static_cast<uint64_t>(st.st_size) < **size)) {
      int fd = ::open(t.path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) return Status::Error(errno, t.path + ": cannot create: " + std::strerror(errno));
      t.created = !t.exists;
      int r = ::ftruncate(fd, static_cast<off_t>(**size));
      while (r != 0 && (errno == EFBIG || errno == EINVAL) && spec.shrink && !spec.size && **size > (16ull << 30)) {
        **size /= 4;
        opts->total_bytes = **size;
        if (**size < (64ull << 30)) opts->metadata_chunk_bytes = 0;
        r = ::ftruncate(fd, static_cast<off_t>(**size));
      }
      const int e = errno;
      ::close(fd);
      if (r != 0) {
        return Status::Error(e, t.path + ": cannot set the size to " + std::to_string(**size) +
                                    " bytes: " + std::strerror(e));
      }
    }
  }
  return Status::Ok();
}

// The chunks by kind, for the report: as mkfs wrote them, or, after an
// import (which adds data chunks; --shrink cuts them), as the chunk tree
// holds them now.
void ReportBlockGroups(const std::vector<Target>& targets, const io::Placement& where, const txn::MkfsOptions& opts,
                       const txn::MkfsSummary& sum, bool imported, MkfsReport* report) {
  std::vector<txn::MkfsChunk> chunks = sum.chunks;
  if (imported) {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    for (const Target& t : targets) {
      if (auto dev = io::OpenImage(t.path, io::OpenFlags{}, where); dev.ok()) devs.push_back(std::move(*dev));
    }
    if (devs.size() == targets.size()) {
      if (auto vol = txn::Volume::Open(std::move(devs), {}); vol.ok()) {
        chunks.clear();
        for (const auto& [logical, c] : (*vol)->chunks().chunks()) chunks.push_back({logical, c.length, c.type, {}, {}, 0});
      }
    }
  }
  auto add = [&](const char* name, uint64_t kind) {
    MkfsReport::BlockGroups g;
    g.kind = name;
    uint64_t type = 0;
    for (const auto& c : chunks) {
      if (c.type & kind) {
        g.bytes += c.length;
        type = c.type;
        ++g.chunks;
      }
    }
    if (!g.bytes) return;
    g.profile = alloc::ProfileName(type);
    report->block_groups.push_back(std::move(g));
  };
  if (opts.mixed) {
    add("Data+Metadata", format::kBlockGroupData | format::kBlockGroupMetadata);
  } else {
    add("Data", format::kBlockGroupData);
    add("Metadata", format::kBlockGroupMetadata);
  }
  add("System", format::kBlockGroupSystem);
}

// What --rootdir imports and how, checked before any image is touched.
struct RootdirPlan {
  bool archive = false;
  std::string root;  // a directory's canonical path
  std::vector<fs::SubvolSpec> subvols;
  std::map<std::string, uint32_t> inode_flags;
  CompressOptions compress;
};

Status PlanRootdir(const MkfsSpec& spec, RootdirPlan* plan) {
  if (!spec.compress.empty()) {
    if (spec.rootdir.empty()) return Status::Invalid("--compress needs --rootdir (it compresses the data copied in)");
    if (Status c = ParseCompressSpec(spec.compress, &plan->compress); !c.ok()) {
      return Status::Error(c.code(), "--compress: " + c.message());
    }
  }
  if (spec.rootdir.empty() && !spec.subvols.empty()) {
    return Status::Invalid("--subvol needs --rootdir (it names a directory in it)");
  }
  if (spec.rootdir.empty() && !spec.inode_flags.empty()) {
    return Status::Invalid("--inode-flags needs --rootdir (it names a path in it)");
  }
  if (spec.rootdir.empty() && spec.owner) {
    return Status::Invalid("--owner needs --rootdir (it sets the owner of what is imported)");
  }
  // --rootdir: a directory, or a tar archive (a file, a pipe; "-": stdin).
  bool& archive = plan->archive;
  if (!spec.rootdir.empty()) {
    struct stat rs;
    if (spec.rootdir == "-") {
      archive = true;
    } else {
      if (::stat(spec.rootdir.c_str(), &rs) != 0) {
        return Status::Error(errno, "--rootdir " + spec.rootdir + ": " + std::strerror(errno));
      }
      if (S_ISREG(rs.st_mode) || S_ISFIFO(rs.st_mode) || S_ISCHR(rs.st_mode)) {
        archive = true;
      } else if (!S_ISDIR(rs.st_mode)) {
        return Status::Invalid("--rootdir " + spec.rootdir + ": not a directory or a tar archive");
      }
    }
  }
  if (spec.reflink && (spec.rootdir.empty() || archive)) {
    return Status::Invalid("--reflink needs a directory --rootdir (it clones the host files' data into the image file)");
  }
  if (spec.reflink && io::IsRbdPath(spec.images.front())) {
    return Status::Invalid(
        "--reflink clones the host files' data into an image file on the same host; not into an RBD image");
  }
  if (spec.reflink && !spec.compress.empty()) {
    return Status::Invalid("--reflink and --compress exclude each other: compressed data is not the host files' bytes");
  }
  if (archive && !spec.subvols.empty()) return Status::Invalid("--subvol needs a directory --rootdir, not an archive");
  if (archive && !spec.inode_flags.empty()) {
    return Status::Invalid("--inode-flags needs a directory --rootdir, not an archive");
  }
  if (!spec.rootdir.empty() && !archive) {
    char* real = ::realpath(spec.rootdir.c_str(), nullptr);
    if (!real) return Status::Error(errno, "--rootdir " + spec.rootdir + ": " + std::strerror(errno));
    plan->root = real;
    std::free(real);
    std::string err;
    auto sv = fs::ParseSubvols(spec.subvols, plan->root, &err);
    if (!sv) return Status::Invalid(err);
    plan->subvols = std::move(*sv);
    auto fl = fs::ParseInodeFlags(spec.inode_flags, plan->root, &err);
    if (!fl) return Status::Invalid(err);
    plan->inode_flags = std::move(*fl);
  }
  return Status::Ok();
}

}  // namespace

Status Mkfs(const MkfsSpec& spec, MkfsReport* report) {
  if (report) *report = MkfsReport{};
  if (spec.images.empty()) return Status::Invalid("no image given");
  const std::string& image = spec.images.front();
  txn::MkfsOptions opts;
  if (Status st = ApplyFeatures(spec.features, &opts); !st.ok()) return Status::Invalid("invalid -O: " + st.message());
  if (spec.mixed) opts.mixed = true;
  for (auto [flag, text, field] : {std::tuple{"-d", &spec.data_profile, &opts.data_profile},
                                   std::tuple{"-m", &spec.metadata_profile, &opts.metadata_profile}}) {
    if (text->empty()) continue;
    *field = txn::ParseProfile(*text);
    if (!*field) {
      return Status::Invalid(std::string("invalid ") + flag + " '" + *text +
                             "': unknown profile (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6)");
    }
  }
  UB_RETURN_IF_ERROR(txn::ValidateMkfsProfiles(opts, spec.images.size()));
  if (spec.images.size() > 1 && spec.shrink) {
    return Status::Invalid("--shrink makes one image file; it cannot go with several devices");
  }
  if (spec.images.size() > 1 && spec.reflink) {
    return Status::Invalid("--reflink clones host files into one image file; it cannot go with several devices");
  }
  opts.sectorsize = spec.sectorsize;
  // Mixed chunks hold data too: nodes of the sector size, as mkfs.btrfs -M.
  opts.nodesize = spec.nodesize ? *spec.nodesize : opts.mixed ? opts.sectorsize : opts.nodesize;
  auto csum = format::CsumTypeFromName(spec.csum);
  if (!csum) return Status::Invalid("invalid --csum '" + spec.csum + "': choose crc32c, xxhash, sha256 or blake2");
  opts.csum_type = *csum;
  opts.label = spec.label;
  if (!spec.uuid.empty()) {
    opts.fsid = txn::ParseUuid(spec.uuid);
    if (!opts.fsid) {
      return Status::Invalid("invalid --uuid '" + spec.uuid +
                             "': expected the form 01234567-89ab-cdef-0123-456789abcdef");
    }
  }
  std::optional<Time> max_time;
  // The fixed clock and uuids are process-wide: back to the real ones when
  // this returns, for a program that goes on to write other images.
  struct RealClockAfter {
    bool on = false;
    ~RealClockAfter() {
      if (on) txn::ClearDeterministic();
    }
  } real_clock_after;
  if (spec.deterministic || spec.source_date_epoch) {
    max_time = MakeDeterministic(spec.source_date_epoch.value_or(0), spec.images.size(), &opts);
    real_clock_after.on = true;
  }
  std::optional<uint64_t> size = spec.size;
  if (size) opts.total_bytes = *size;
  io::Placement where;
  where.offset = spec.offset;
  where.partition = spec.partition;
  if (spec.shrink) {
    if (spec.rootdir.empty()) {
      return Status::Invalid("--shrink needs --rootdir (it makes the image as small as what is imported)");
    }
    if (where.offset != 0 || where.partition != 0) {
      return Status::Invalid("--shrink makes an image file; it cannot go with --offset or --partition");
    }
    struct stat ist;
    if (io::IsRbdPath(image) || (::stat(image.c_str(), &ist) == 0 && !S_ISREG(ist.st_mode))) {
      return Status::Invalid("--shrink needs an image file (" + image + " is not a regular file)");
    }
    // Built in a large sparse file (the given size, else 1 TiB: data chunks
    // fill it from the start, the metadata chunk waits at the end), then
    // cut to fit.
    if (!size) {
      size = kShrinkBuildBytes;
      opts.total_bytes = *size;
    }
    // Mixed chunks hold both kinds: no layout to choose, the trim and
    // compaction cut them to what they hold.
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
    return Status::Error(st.code(), msg);
  }

  RootdirPlan plan;
  UB_RETURN_IF_ERROR(PlanRootdir(spec, &plan));

  std::vector<Target> targets;
  UB_RETURN_IF_ERROR(CheckTargets(spec, size, opts, where, &targets));
  if (Status s = CreateTargets(spec, targets, &size, &opts); !s.ok()) {
    RemoveCreated(targets);
    return s;
  }
  txn::MkfsSummary sum;
  {
    std::vector<std::unique_ptr<io::BlockDevice>> devs;
    std::vector<io::BlockDevice*> raw;
    for (const Target& t : targets) {
      auto dev = io::OpenImage(t.path, io::OpenFlags{true}, where);
      if (!dev.ok()) {
        devs.clear();
        RemoveCreated(targets);
        return dev.status();
      }
      raw.push_back(dev->get());
      devs.push_back(std::move(*dev));
    }
    if (Status s = txn::MakeFilesystem(raw, opts, &sum); !s.ok()) {
      devs.clear();
      RemoveCreated(targets);
      return Status::Error(s.code(), (targets.size() == 1 ? image : std::string("mkfs")) + ": " + s.message());
    }
  }
  // --rootdir: the host tree goes in through the library's write API (new
  // chunks are allocated as the data needs them).
  ImportStats stats;
  if (!spec.rootdir.empty()) {
    OpenOptions oo;
    oo.writable = true;
    oo.node_cache_bytes = 16ull << 20;  // an import writes through the transaction, not the read cache
    oo.max_dirty_bytes = 32ull << 20;    // peak memory below mkfs.btrfs's on large trees
    oo.compress = plan.compress;
    oo.offset = where.offset;
    oo.partition = where.partition;
    oo.devices.assign(spec.images.begin() + 1, spec.images.end());
    auto fs = Filesystem::Open(image, oo);
    if (!fs.ok()) return Status::Error(fs.status().code(), image + ": reopening for --rootdir: " + fs.status().ToString());
    Status s;
    if (plan.archive) {
      ImportOptions io;
      io.owner = spec.owner;
      io.max_time = max_time;
      io.progress = spec.progress;
      s = ImportArchive(**fs, spec.rootdir, (*fs)->Root(), io, &stats);
    } else {
      s = fs::ImportRootdir(**fs, plan.root, plan.subvols, plan.inode_flags, spec.owner, max_time, spec.progress,
                            &stats, spec.reflink);
    }
    if (s.ok()) s = (*fs)->Commit();
    if (!s.ok() && plan.archive && std::any_of(targets.begin(), targets.end(), [](const Target& t) { return t.created; })) {
      fs->reset();
      RemoveCreated(targets);
      return Status::Error(s.code(), "--rootdir: " + s.ToString());
    }
    if (!s.ok()) {
      return Status::Error(s.code(), image + ": importing " + spec.rootdir + ": " + s.ToString() +
                                         " (the filesystem holds what was committed before the error)");
    }
  }
  std::optional<uint64_t> shrunk_to;
  if (spec.shrink) {
    ResizeResult r;
    if (Status s = ShrinkImageToFit(image, &r); !s.ok()) {
      return Status::Error(s.code(), image + ": --shrink: " + s.ToString());
    }
    shrunk_to = r.new_bytes;
  }
  if (!report) return Status::Ok();

  const bool imported = !spec.rootdir.empty();
  report->imported = imported;
  report->import = stats;
  for (const auto& sv : plan.subvols) report->subvols.push_back({sv.rel, sv.read_only, sv.is_default});
  report->shrunk_to = shrunk_to;
  report->total_bytes = shrunk_to.value_or(sum.total_bytes);
  report->fsid = format::UuidToString(sum.fsid.data());
  report->label = opts.label;
  report->nodesize = opts.nodesize;
  report->sectorsize = opts.sectorsize;
  report->csum = format::CsumTypeName(opts.csum_type);
  report->superblock_copies = sum.superblock_copies;
  report->features = {"mixed-backref", "extended-iref", "skinny-metadata", "no-holes", "free-space-tree"};
  if (opts.mixed) report->features.push_back("mixed-bg");
  if (opts.block_group_tree) report->features.push_back("block-group-tree");
  for (size_t i = 0; i < targets.size(); ++i) report->devices.emplace_back(targets[i].path, sum.dev_bytes[i]);
  ReportBlockGroups(targets, where, opts, sum, imported, report);
  return Status::Ok();
}

}  // namespace ubtrfs
