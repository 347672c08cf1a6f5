// Making a filesystem, as `ubtrfs mkfs` and mkfs.ubtrfs do (and
// mkfs.btrfs): the images checked, created or extended, the filesystem
// written over all of them, a host tree or a tar archive imported, the
// image shrunk to fit. For programs that build images (the C API's
// ubtrfs_mkfs makes the plain case).
#ifndef UBTRFS_MKFS_H_
#define UBTRFS_MKFS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/import.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct MkfsSpec {
  // Image files (created with `size` where missing), block devices or
  // rbd:POOL/IMAGE; several make one filesystem with devids 1, 2, ...
  std::vector<std::string> images;
  // Each image's size: image files and RBD images are created or extended
  // to it. Without it every image must exist (and the filesystem takes
  // the whole of each).
  std::optional<uint64_t> size;
  // Tree block size (default 16384; with `mixed`, the sector size).
  std::optional<uint32_t> nodesize;
  uint32_t sectorsize = 4096;
  std::string csum = "crc32c";  // crc32c, xxhash, sha256 or blake2
  std::string label;
  std::string uuid;              // 01234567-89ab-cdef-0123-456789abcdef; random if empty
  std::string data_profile;      // single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6
  std::string metadata_profile;  // (default: single data; dup metadata on one device, raid1 on several)
  // -O lists as mkfs.btrfs takes them: "block-group-tree,^mixed-bg".
  std::vector<std::string> features;
  bool mixed = false;  // data and metadata in the same chunks (-M)
  // A host directory, a tar archive (plain, gzip, xz, zstd...) or "-"
  // (stdin): its contents go into the top-level subvolume.
  std::string rootdir;
  std::string compress;                // ALG[:LEVEL] for the imported data
  std::vector<std::string> subvols;    // [rw|ro|default|default-ro:]SUBDIR of a directory rootdir
  std::vector<std::string> inode_flags;  // nodatacow|nodatasum[,...]:PATH of a directory rootdir
  std::optional<std::pair<uint32_t, uint32_t>> owner;  // uid, gid of everything imported
  // The same input gives the same image bytes: uuids from `uuid` or a seed
  // of the epoch and the label, the filesystem's times and imported times
  // clamped to `source_date_epoch` (0 if unset). Given an epoch, on anyway.
  bool deterministic = false;
  std::optional<int64_t> source_date_epoch;
  bool shrink = false;   // with rootdir: the smallest image file that holds it
  bool reflink = false;  // with a directory rootdir: clone host file data (FICLONERANGE)
  bool force = false;    // overwrite an existing btrfs filesystem
  // The filesystem inside an existing image: at this byte offset, or in
  // this partition (1-based) of its partition table (no `size` then).
  uint64_t offset = 0;
  int partition = 0;
  // Called now and then with the import's running totals.
  std::function<void(const ImportStats&)> progress;
};

// What was made, for a summary like mkfs.btrfs's.
struct MkfsReport {
  std::string fsid;
  std::string label;
  uint32_t nodesize = 0, sectorsize = 0;
  std::string csum;
  uint64_t total_bytes = 0;
  std::optional<uint64_t> shrunk_to;  // with `shrink`: the image file's new size
  // Per kind ("Data", "Metadata", "System"; "Data+Metadata" when mixed):
  // the profile, the bytes and number of chunks.
  struct BlockGroups {
    std::string kind, profile;
    uint64_t bytes = 0;
    int chunks = 0;
  };
  std::vector<BlockGroups> block_groups;
  std::vector<std::string> features;
  int superblock_copies = 0;
  std::vector<std::pair<std::string, uint64_t>> devices;  // path, bytes (devid = index + 1)
  bool imported = false;
  ImportStats import;
  struct Subvol {
    std::string path;  // relative to the rootdir
    bool read_only = false, is_default = false;
  };
  std::vector<Subvol> subvols;
};

// `report` may be null (nothing is gathered for it then). Everything is
// checked before anything is written; an image file this
// call created is removed again if making the filesystem fails. An import
// that fails leaves the filesystem with what was committed before the
// error (a new image file made from an archive is removed).
UBTRFS_API Status Mkfs(const MkfsSpec& spec, MkfsReport* report = nullptr);

}  // namespace ubtrfs

#endif  // UBTRFS_MKFS_H_
