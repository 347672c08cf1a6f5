// mkfs: the command line of `ubtrfs mkfs` and mkfs.ubtrfs, parsed into the
// library's MkfsSpec (include/ubtrfs/mkfs.h, which does the work), and
// mkfs.btrfs's summary printed from its report.
#include <unistd.h>

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/progress_line.h"
#include "ubtrfs/import.h"
#include "ubtrfs/mkfs.h"
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

// "ubtrfs mkfs", or the program's own name (mkfs.ubtrfs), before errors.
std::string g_program = "ubtrfs mkfs";

void Fail(const std::string& msg) {
  fmt::print(stderr, "{}: {}\n", g_program, msg);
  SetExitCode(1);
}

// "65536", "64k", "64K", "512M", "512MiB", "1G", "2T": bytes (binary units).
std::optional<uint64_t> ParseSize(std::string_view s) {
  uint64_t v = 0;
  if (!ParseByteSize(s, &v).ok()) return std::nullopt;
  return v;
}

void PrintReport(const MkfsSpec& spec, const MkfsReport& r) {
  fmt::print("Label:              {}\n", r.label.empty() ? "(null)" : r.label);
  fmt::print("UUID:               {}\n", r.fsid);
  fmt::print("Node size:          {}\n", r.nodesize);
  fmt::print("Sector size:        {}\n", r.sectorsize);
  fmt::print("Filesystem size:    {}\n", Human(r.total_bytes));
  if (r.shrunk_to) fmt::print("Shrunk to:          {} bytes ({})\n", *r.shrunk_to, Human(*r.shrunk_to));
  fmt::print("Block group profiles:\n");
  for (const auto& g : r.block_groups) {
    fmt::print("  {:<17} {:<16} {:>10}{}\n", g.kind + ":", g.profile, Human(g.bytes),
               g.chunks > 1 ? fmt::format(" ({} chunks)", g.chunks) : "");
  }
  std::string features;
  for (const auto& f : r.features) features += (features.empty() ? "" : ", ") + f;
  fmt::print("Features:           {}\n", features);
  fmt::print("Checksum:           {}\n", r.csum);
  fmt::print("Superblock copies:  {}\n", r.superblock_copies);
  if (r.devices.size() > 1) {
    fmt::print("Number of devices:  {}\n", r.devices.size());
    fmt::print("Devices:\n   ID        SIZE  PATH\n");
    for (size_t i = 0; i < r.devices.size(); ++i) {
      fmt::print("  {:>3}  {:>10}  {}\n", i + 1, Human(r.devices[i].second), r.devices[i].first);
    }
  }
  if (r.imported) {
    const ImportStats& st = r.import;
    fmt::print("Rootdir:            {}: {} files, {} directories, {} symlinks, {} hard links, {} special files, {}\n",
               spec.rootdir, st.files, st.dirs, st.symlinks, st.hardlinks, st.specials, Human(st.bytes));
    if (spec.reflink) {
      fmt::print("  reflink:          {} shared with the host files, {} copied by the kernel, {} written\n",
                 Human(st.reflinked_bytes), Human(st.kernel_copied_bytes),
                 Human(st.bytes - std::min(st.bytes, st.reflinked_bytes + st.kernel_copied_bytes)));
    }
    for (const auto& sv : r.subvols) {
      fmt::print("  subvolume:        {} ({}{})\n", sv.path, sv.read_only ? "ro" : "rw", sv.is_default ? ", default" : "");
    }
  }
}

// The command line as the library's MkfsSpec: sizes, the owner and
// SOURCE_DATE_EPOCH parsed here, everything else checked by Mkfs.
void CmdMkfs(const MkfsArgs& a) {
  MkfsSpec spec;
  spec.images = a.images;
  if (!a.size.empty()) {
    spec.size = ParseSize(a.size);
    if (!spec.size) return Fail("invalid --size '" + a.size + "': not a size (e.g. 1073741824, 512M, 1G)");
  }
  auto nodesize = ParseSize(a.nodesize);
  if (!nodesize || *nodesize > UINT32_MAX) return Fail("invalid --nodesize '" + a.nodesize + "': not a size");
  if (a.nodesize_given) spec.nodesize = static_cast<uint32_t>(*nodesize);
  auto sectorsize = ParseSize(a.sectorsize);
  if (!sectorsize || *sectorsize > UINT32_MAX) return Fail("invalid --sectorsize '" + a.sectorsize + "': not a size");
  spec.sectorsize = static_cast<uint32_t>(*sectorsize);
  spec.csum = a.csum;
  spec.label = a.label;
  spec.uuid = a.uuid;
  spec.data_profile = a.data_profile;
  spec.metadata_profile = a.metadata_profile;
  spec.features = a.features;
  spec.mixed = a.mixed;
  spec.rootdir = a.rootdir;
  spec.compress = a.compress;
  spec.subvols = a.subvols;
  spec.inode_flags = a.inode_flags;
  if (!a.owner.empty()) {
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
    spec.owner.emplace(*uid, *gid);
  }
  // Byte-identical images with SOURCE_DATE_EPOCH or --deterministic.
  spec.deterministic = a.deterministic;
  if (const char* sde = std::getenv("SOURCE_DATE_EPOCH"); sde && *sde) {
    const std::string_view v(sde);
    auto n = ParseSize(v);
    if (!n || v.find_first_not_of("0123456789") != std::string_view::npos || *n > uint64_t{INT64_MAX}) {
      return Fail(std::string("SOURCE_DATE_EPOCH '") + sde + "' is not a number of seconds since 1970");
    }
    spec.source_date_epoch = static_cast<int64_t>(*n);
  }
  spec.shrink = a.shrink;
  spec.reflink = a.reflink;
  spec.force = a.force;
  spec.offset = Placement().offset;
  spec.partition = Placement().partition;
  // Progress only where someone watches: a terminal, and not with -q.
  ProgressLine progress(!a.quiet && ::isatty(STDERR_FILENO));
  spec.progress = [&progress](const ImportStats& st) { progress.Update(st); };
  MkfsReport report;
  Status s = Mkfs(spec, a.quiet ? nullptr : &report);
  progress.Done();
  if (!s.ok()) return Fail(s.message());
  if (!a.quiet) PrintReport(spec, report);
}

}  // namespace

void AddMkfsOptions(CLI::App* cmd) {
  static MkfsArgs args;
  if (cmd->get_parent() == nullptr) g_program = cmd->get_name();
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
