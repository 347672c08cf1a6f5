// libubtrfs: open a btrfs image from user space and read it.
//
//   auto fs = ubtrfs::Filesystem::Open("disk.img");
//   if (!fs.ok()) { report(fs.status()); }
//   auto ino = (*fs)->Lookup("/etc/hostname");
//   std::vector<uint8_t> buf(4096);
//   auto n = (*fs)->Read(*ino, 0, buf);
//
// Every method is safe to call from several threads at once. Reads, and
// Create/Mkdir/Mknod in different directories, run in parallel; the other
// changes, and Commit, run one at a time (Commit waits for the operations in
// flight and holds new ones while it runs).
#ifndef UBTRFS_FILESYSTEM_H_
#define UBTRFS_FILESYSTEM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ubtrfs/block_device.h"
#include "ubtrfs/export_macros.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

// An inode is named by the subvolume (tree) that holds it and its number.
struct InodeId {
  uint64_t root = 0;
  uint64_t ino = 0;
  friend bool operator==(const InodeId&, const InodeId&) = default;
};
// The inode number of every subvolume's top directory.
inline constexpr uint64_t kSubvolTopIno = 256;

struct Time {
  int64_t sec = 0;
  uint32_t nsec = 0;
};

struct Stat {
  InodeId id;
  uint32_t mode = 0;  // S_IFMT bits and permissions, as in struct stat
  uint32_t nlink = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t rdev = 0;
  uint64_t size = 0;
  uint64_t nbytes = 0;  // bytes of data allocated (st_blocks * 512)
  uint64_t generation = 0;
  uint64_t flags = 0;  // btrfs inode flags (NODATASUM, COMPRESS, ...)
  Time atime, mtime, ctime, otime;
};

struct DirEntry {
  std::string name;
  InodeId id;
  uint8_t type = 0;    // DT_* value (DT_REG, DT_DIR, DT_LNK, ...)
  uint64_t index = 0;  // DIR_INDEX sequence number: the readdir cookie
};

// A directory entry that a listing leaves out because no POSIX program could
// be handed it safely: a damaged or hostile image's name that is empty, longer
// than 255 bytes, holds '/' or NUL, is "." or "..", or repeats an earlier
// entry's name in the same directory (the entry with the lowest index wins).
struct SkippedEntry {
  std::string name;    // the stored bytes, as they are (may hold '/' or NUL)
  uint64_t index = 0;  // its DIR_INDEX sequence number
  std::string reason;  // e.g. "name contains '/'", "duplicate of the entry at index 5"
  // An empty `name`: not one entry but a damaged tree block that held
  // entries from `index` on (RescueOptions::salvage). `lost`: names are
  // missing from the listing for it (the directory's size says so).
  bool lost = false;
};

struct FsStat {  // what the kernel's statfs(2) reports for a mount (read-only for a read-only view)
  uint32_t block_size = 0;   // sectorsize
  uint32_t node_size = 0;
  uint64_t total_bytes = 0;  // f_blocks: the devices' size / the copies the data profile keeps
  uint64_t used_bytes = 0;   // bytes of extents, each counted once (the superblock's bytes_used)
  uint64_t free_bytes = 0;   // f_bfree: total less device bytes in use (/ data copies) less the kernel's global reserve
  uint64_t avail_bytes = 0;  // f_bavail: what file data can still take (free data space, unallocated), never metadata
  uint64_t name_max = 255;
};

struct FsInfo {
  std::string label;
  std::string fsid;  // canonical UUID text
  uint64_t generation = 0;
  uint32_t sectorsize = 0;
  uint32_t nodesize = 0;
  std::string csum_type;
  uint64_t total_bytes = 0;
  uint64_t bytes_used = 0;
  uint64_t num_devices = 0;
  uint64_t incompat_flags = 0;
  uint64_t compat_ro_flags = 0;
  int superblock_mirror = 0;  // which superblock copy was used
  uint64_t devid = 0;         // the device whose superblock this is
  std::vector<uint64_t> devices_missing;  // devids the filesystem lists that were not opened
};

// Attributes of a new inode. Times default to now.
struct NewInode {
  uint32_t mode = 0;  // permission bits (and S_IFMT for Mknod)
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t rdev = 0;  // Mknod of a device: a dev_t as makedev() builds it
  std::optional<Time> atime, mtime, ctime;
};

// A setattr: only the fields that are set change.
struct AttrChange {
  std::optional<uint32_t> mode;  // permission bits only
  std::optional<uint32_t> uid, gid;
  std::optional<uint64_t> size;  // truncate or extend (regular files)
  std::optional<Time> atime, mtime, ctime;
};

inline constexpr unsigned kRenameNoReplace = 1;  // RENAME_NOREPLACE
inline constexpr unsigned kRenameExchange = 2;   // RENAME_EXCHANGE
// The rename takes a name out of view as part of a deletion (a mount keeps a
// file unlinked while open under a hidden name): like an unlink it may use
// the global metadata reserve, so it works on a metadata-full device.
inline constexpr unsigned kRenameForDeletion = 1u << 16;

// Compression of file data on write, as the kernel's compress= and
// compress-force= mount options. Without `force`, a file whose data does not
// compress (a 128 KiB range saving less than a sector) is marked NOCOMPRESS
// and written plain from then on; with it every range is tried. A file's
// btrfs.compression property ("zlib", "lzo", "zstd"; "no" or "none" turns it
// off) and its COMPRESS/NOCOMPRESS flags take precedence as in the kernel.
enum class CompressAlgorithm : uint8_t { kNone = 0, kZlib = 1, kLzo = 2, kZstd = 3 };

struct CompressOptions {
  CompressAlgorithm algorithm = CompressAlgorithm::kNone;
  // 0: the algorithm's default (zlib 3, zstd 3). zlib 1..9, zstd -15..15
  // (0 excluded); lzo has no levels.
  int level = 0;
  bool force = false;
};

// Parses "zstd", "zlib:9", "lzo", "zstd:-5", "no"/"none" (the kernel's
// compress= values) into `out`, keeping out->force. Inline so that the
// front ends need no exported symbol for it.
inline Status ParseCompressSpec(std::string_view spec, CompressOptions* out) {
  std::string_view alg = spec, lvl;
  if (auto colon = spec.find(':'); colon != std::string_view::npos) {
    alg = spec.substr(0, colon);
    lvl = spec.substr(colon + 1);
  }
  const auto bad = [&](std::string_view why) {
    return Status::Invalid("compression \"" + std::string(spec) + "\": " + std::string(why));
  };
  CompressOptions c;
  c.force = out->force;
  int lo = 0, hi = 0;
  if (alg == "zlib") {
    c.algorithm = CompressAlgorithm::kZlib, lo = 1, hi = 9;
  } else if (alg == "zstd") {
    c.algorithm = CompressAlgorithm::kZstd, lo = -15, hi = 15;
  } else if (alg == "lzo") {
    c.algorithm = CompressAlgorithm::kLzo;
  } else if (alg == "no" || alg == "none") {
    c.algorithm = CompressAlgorithm::kNone;
  } else {
    return bad("unknown algorithm (zlib, lzo, zstd or no)");
  }
  if (!lvl.empty() || spec.size() != alg.size()) {
    if (lo == hi) return bad("this algorithm takes no level");
    int v = 0;
    bool neg = false;
    size_t i = 0;
    if (i < lvl.size() && lvl[i] == '-') neg = true, ++i;
    if (i == lvl.size() || lvl.size() - i > 3) return bad("level must be a number");
    for (; i < lvl.size(); ++i) {
      if (lvl[i] < '0' || lvl[i] > '9') return bad("level must be a number");
      v = v * 10 + (lvl[i] - '0');
    }
    if (neg) v = -v;
    if (v < lo || v > hi || v == 0) {
      return bad("level must be in " + std::to_string(lo) + ".." + std::to_string(hi) + " (not 0)");
    }
    c.level = v;
  }
  *out = c;
  return Status::Ok();
}

// What a read-only open may skip or fall back on to read an image a normal
// open refuses, as the kernel's -o rescue= options (its names in brackets).
// Every one of them needs a read-only open (EINVAL otherwise), and each
// fallback taken is told in Warnings().
struct RescueOptions {
  // [usebackuproot] The root tree's root block cannot be read: use the
  // newest of the superblock's backup roots that reads (an older commit).
  bool use_backup_root = false;
  // [nologreplay] Leave a tree log alone: the view of the last commit,
  // without what was fsynced after it.
  bool no_log_replay = false;
  // [ignorebadroots] The csum tree's root cannot be read: file data is read
  // without checksums. A damaged "default" entry: paths start at the top level.
  bool ignore_bad_roots = false;
  // [ignoredatacsums] File data is not checked against its checksums.
  bool ignore_data_csums = false;
  // [ignoremetacsums] A tree block whose checksum fails in every copy is used
  // when its structure holds (header, item offsets, key order).
  bool ignore_meta_csums = false;
  // [ignoresuperflags] Superblock flags of an interrupted btrfstune
  // conversion (block group tree, checksum type) or unknown ones are warned
  // of instead of refused.
  bool ignore_super_flags = false;
  // [salvage, ubtrfs's own] A directory whose tree blocks do not all read
  // lists what the readable ones hold, and the names its name-hash items
  // keep of the rest; ReadDir's `skipped` says what was lost where.
  bool salvage = false;
  // [ubtrfs's own, as btrfs restore -t and btrfs check --tree-root] The root
  // tree's root is the tree block at this logical address (an older
  // commit's, as `ubtrfs inspect find-root` lists them) instead of the
  // superblock's; its trees are read as that commit left them, without the
  // tree log. 0: the superblock's.
  uint64_t tree_root = 0;
  // [ubtrfs's own, as btrfs check --super] Read superblock copy N (0 at
  // 64 KiB, 1 at 64 MiB, 2 at 256 GiB) of every device, not the best
  // valid one. -1: the best.
  int super_mirror = -1;

  bool any() const {
    return use_backup_root || no_log_replay || ignore_bad_roots || ignore_data_csums || ignore_meta_csums ||
           ignore_super_flags || salvage || tree_root != 0 || super_mirror >= 0;
  }
};

// Parses a list of the kernel's rescue= names, separated by ':' (as in
// -o rescue=usebackuproot:nologreplay) or ',': usebackuproot, nologreplay,
// ignorebadroots (ibadroots), ignoredatacsums (idatacsums), ignoremetacsums
// (imetacsums), ignoresuperflags (isuperflags), salvage (not the kernel's),
// all (every one of them). Adds to `out`.
inline Status ParseRescueOptions(std::string_view list, RescueOptions* out) {
  RescueOptions r = *out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find_first_of(":,", pos);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view name = list.substr(pos, end - pos);
    pos = end + 1;
    if (name == "usebackuproot") {
      r.use_backup_root = true;
    } else if (name == "nologreplay") {
      r.no_log_replay = true;
    } else if (name == "ignorebadroots" || name == "ibadroots") {
      r.ignore_bad_roots = true;
    } else if (name == "ignoredatacsums" || name == "idatacsums") {
      r.ignore_data_csums = true;
    } else if (name == "ignoremetacsums" || name == "imetacsums") {
      r.ignore_meta_csums = true;
    } else if (name == "ignoresuperflags" || name == "isuperflags") {
      r.ignore_super_flags = true;
    } else if (name == "salvage") {
      r.salvage = true;
    } else if (name == "all") {
      r.use_backup_root = r.no_log_replay = r.ignore_bad_roots = r.ignore_data_csums = r.ignore_meta_csums =
          r.ignore_super_flags = r.salvage = true;
    } else {
      return Status::Invalid("rescue option \"" + std::string(name) +
                             "\" is not one of usebackuproot, nologreplay, ignorebadroots, ignoredatacsums, "
                             "ignoremetacsums, ignoresuperflags, salvage, all");
    }
  }
  *out = r;
  return Status::Ok();
}

struct OpenOptions {
  // Open for writing: changes join a running transaction that Commit()
  // makes durable (and the destructor commits what is left).
  bool writable = false;
  // Verify data checksums on read (EIO on mismatch, after trying every copy).
  bool verify_data_csums = true;
  // Bytes of tree blocks kept in the node cache.
  size_t node_cache_bytes = 64ull << 20;
  // A running transaction is committed when its dirty tree blocks pass this
  // many bytes, bounding its memory. Larger means fewer commits (each
  // rewrites the leaves changed since the last: 64 MiB made 100,000-file
  // directories about a third faster to fill than 32 MiB) and more memory.
  // 256 MiB: two 300,000-entry directories filled at once (their name-hash
  // leaves alone are about 70 MiB, rewritten by every commit) stop
  // committing every few thousand files, which 64 MiB did.
  uint64_t max_dirty_bytes = 256ull << 20;
  // Benchmark baseline only: batch delayed dir-index items by the free space
  // of the leaf they land in (the kernel's behaviour before leaf-sized
  // batches) instead of by what a whole leaf holds.
  bool legacy_dir_index_batching = false;
  // Delayed DIR_ITEMs: a directory's name hashes are indexed once it has
  // taken this many creates (and enough to pay for the scan), and its queued
  // DIR_ITEMs are inserted in hash order when it holds dir_item_batch of
  // them (and at commit). 0 keeps the default (1024 and 16384); tests set
  // them low to run every directory through the queue.
  uint32_t dir_item_index_after = 0;
  uint32_t dir_item_batch = 0;
  // A deleted subvolume's tree is dropped in steps of this many freed tree
  // blocks, each committed (a crash between them resumes at the next
  // writable open, as the kernel's cleaner does). 0 keeps the default, 4096;
  // tests set it low to stop a drop half way.
  uint64_t drop_blocks_per_commit = 0;
  // Where paths start, as the kernel's subvol= and subvolid= mount options:
  // `subvol` is a subvolume's path from the top level, `subvolid` its id
  // (5 is the top level). Given both, they must name the same subvolume
  // (EINVAL otherwise); neither: the default subvolume. ENOENT for an id
  // that is no subvolume, EINVAL for a path that is not a subvolume's top.
  std::string subvol;
  uint64_t subvolid = 0;
  // Keep in memory what each write of the running transaction overwrites
  // (file data goes into free space before the commit), so that Discard()
  // leaves the image byte for byte as at the last commit. Costs a read and
  // the memory of every byte written between commits; for all-or-nothing
  // edits (`ubtrfs edit`). Only the caller's Commit() (and the calls
  // documented to commit: snapshots, subvolumes, Fsync) commits then: no
  // commit at max_dirty_bytes, none to retry a change that met ENOSPC.
  bool undo_uncommitted = false;
  // Where the filesystem lies in the image: `offset` bytes in, or partition
  // `partition` (1-based) of a GPT or MBR partition table (read with
  // libblkid). Nothing outside it is read or written.
  uint64_t offset = 0;
  int partition = 0;
  // A filesystem over several devices: the others besides `path` (Open
  // also takes "a.img,b.img" as `path`), and directories whose files are
  // scanned for the rest (same fsid). `offset`/`partition` apply to each.
  std::vector<std::string> devices;
  std::vector<std::string> scan_dirs;
  // Open for writing although devices are missing (the kernel's -o
  // degraded); without it such an open fails with ENODEV. Reads of a
  // degraded filesystem always work where another copy or parity is there.
  bool degraded = false;
  // Compress file data written through this handle (Write, and the imports
  // of ubtrfs/import.h); see CompressOptions. Default: none, as the kernel.
  CompressOptions compress;
  // Reading a damaged image (read-only opens only); see RescueOptions.
  RescueOptions rescue;
};

// One subvolume or snapshot, as `btrfs subvolume list` shows it.
struct SubvolumeInfo {
  uint64_t id = 0;
  uint64_t parent_id = 0;  // the subvolume holding its entry; 0 for the top level (5)
  uint64_t dir_ino = 0;    // the directory of that entry, in the parent
  std::string path;        // from the top level, without a leading slash ("" for the top level)
  std::array<uint8_t, 16> uuid{}, parent_uuid{}, received_uuid{};
  uint64_t generation = 0, ctransid = 0, otransid = 0;
  Time ctime, otime;
  bool read_only = false;
};

// fs-verity, as the kernel's FS_IOC_ENABLE_VERITY takes it: how a file's
// Merkle tree is built.
struct VerityParams {
  uint8_t hash_algorithm = 1;      // 1: SHA-256, 2: SHA-512
  uint32_t block_size = 4096;      // a power of two from 1024 up to the sector size
  std::vector<uint8_t> salt;       // at most 32 bytes
  std::vector<uint8_t> signature;  // stored as given (the kernel's built-in signatures); not checked here
};
// What FS_IOC_MEASURE_VERITY and FS_IOC_READ_VERITY_METADATA tell of a file.
struct VerityInfo {
  VerityParams params;
  uint64_t data_size = 0;
  std::vector<uint8_t> root_hash;  // of the Merkle tree
  std::vector<uint8_t> digest;     // the file's digest, as `fsverity measure` prints it
};
// In Stat::flags: the file has fs-verity (the inode's RO_VERITY flag).
inline constexpr uint64_t kStatFlagVerity = 1ull << 32;

class UBTRFS_API Filesystem {
 public:
  // `path`: an image file, a block device, or rbd:POOL/IMAGE[@SNAP][:KEY=VALUE...]
  // (ubtrfs/block_device.h).
  static Result<std::unique_ptr<Filesystem>> Open(const std::string& path, const OpenOptions& options = {});
  // On a device the caller supplies (its own BlockDevice, or one from
  // OpenBlockDevice), which the Filesystem owns from now on. options.offset
  // and options.partition apply within it.
  static Result<std::unique_ptr<Filesystem>> Open(std::unique_ptr<BlockDevice> device,
                                                  const OpenOptions& options = {});
  virtual ~Filesystem() = default;

  // Things that did not stop the open but a user should hear of (e.g. "primary
  // superblock damaged (...); using the copy at 64 MiB").
  virtual const std::vector<std::string>& Warnings() const = 0;
  virtual FsInfo Info() const = 0;

  virtual InodeId Root() const = 0;
  // Resolves an absolute path (symlinks are not followed; "." and ".." are).
  virtual Result<InodeId> Lookup(std::string_view path) = 0;
  virtual Result<InodeId> LookupChild(InodeId dir, std::string_view name) = 0;
  virtual Result<Stat> GetStat(InodeId id) = 0;
  // Entries in DIR_INDEX order, without "." and "..". Entries whose names
  // are not valid POSIX names, or repeat a name, are never returned; when
  // `skipped` is given, each such entry is appended to it (so a caller can
  // warn, or refuse the image).
  virtual Result<std::vector<DirEntry>> ReadDir(InodeId dir, std::vector<SkippedEntry>* skipped) = 0;
  Result<std::vector<DirEntry>> ReadDir(InodeId dir) { return ReadDir(dir, nullptr); }
  // Reads up to buf.size() bytes at offset; returns the count (0 at EOF).
  virtual Result<size_t> Read(InodeId file, uint64_t offset, std::span<uint8_t> buf) = 0;
  // Read without the copy into a buffer where it can: on success `send` is
  // called once with the bytes Read would give, as pieces in file order
  // (their sizes add up to the count returned): parts of `scratch` (holes,
  // inline and compressed data; scratch[i] is file offset + i, so its size
  // bounds the read) and ranges of the image file mapped in place, checked
  // against their checksums as Read checks them. The pieces stay valid and
  // unchanged only during the call, which holds off commits: `send` only
  // hands them on (the FUSE mount writes its reply from them) and does not
  // call into the library. It may install a SIGBUS handler (a page
  // of a map that cannot be read raises SIGBUS where pread returns EIO),
  // which passes any SIGBUS it did not cause to the handler before it.
  struct ReadPiece {
    const uint8_t* data;
    size_t size;
  };
  using ReadSink = std::function<void(std::span<const ReadPiece> pieces)>;
  virtual Result<size_t> ReadPieces(InodeId file, uint64_t offset, std::span<uint8_t> scratch, const ReadSink& send) {
    auto n = Read(file, offset, scratch);
    if (!n.ok()) return n;
    const ReadPiece whole{scratch.data(), *n};
    send(std::span(&whole, *n > 0 ? 1 : 0));
    return n;
  }
  virtual Result<std::string> ReadLink(InodeId link) = 0;
  // lseek(2) SEEK_DATA (hole false) / SEEK_HOLE (hole true) on a regular
  // file: the first offset at or after `offset` in data / in a hole (the end
  // of the file counts as a hole). ENXIO when `offset` is at or past the end,
  // or (SEEK_DATA) only holes follow. This default sees the file as all data.
  virtual Result<uint64_t> SeekHole(InodeId file, uint64_t offset, bool hole) {
    auto st = GetStat(file);
    if (!st.ok()) return st.status();
    if (offset >= st->size) return Status::Error(ENXIO, "offset at or past the end of the file");
    return hole ? st->size : offset;
  }

  virtual Result<std::vector<std::string>> ListXattr(InodeId id) = 0;
  virtual Result<std::string> GetXattr(InodeId id, std::string_view name) = 0;
  virtual Result<FsStat> StatFs() = 0;

  // ---- Write side (EROFS unless opened writable) ----
  virtual Result<InodeId> Create(InodeId dir, std::string_view name, const NewInode& attrs) = 0;
  virtual Result<InodeId> Mkdir(InodeId dir, std::string_view name, const NewInode& attrs) = 0;
  // Fifos, sockets and device nodes: attrs.mode carries S_IFMT.
  virtual Result<InodeId> Mknod(InodeId dir, std::string_view name, const NewInode& attrs) = 0;
  virtual Result<InodeId> Symlink(InodeId dir, std::string_view name, std::string_view target,
                                  const NewInode& attrs) = 0;
  virtual Status Link(InodeId inode, InodeId dir, std::string_view name) = 0;
  virtual Status Unlink(InodeId dir, std::string_view name) = 0;
  virtual Status Rmdir(InodeId dir, std::string_view name) = 0;
  virtual Status Rename(InodeId old_dir, std::string_view old_name, InodeId new_dir, std::string_view new_name,
                        unsigned flags = 0) = 0;
  virtual Result<size_t> Write(InodeId file, uint64_t offset, std::span<const uint8_t> data) = 0;
  virtual Status SetAttr(InodeId id, const AttrChange& change) = 0;
  // flags: XATTR_CREATE / XATTR_REPLACE as in setxattr(2), or 0.
  virtual Status SetXattr(InodeId id, std::string_view name, std::string_view value, int flags = 0) = 0;
  virtual Status RemoveXattr(InodeId id, std::string_view name) = 0;
  // Open files (POSIX keeps a file unlinked while open until its last
  // close): while an inode is pinned, removing its last name (Unlink, or a
  // Rename over it) leaves it without names (nlink 0) and with an orphan
  // item, as the kernel does; it stays readable and writable by id, and the
  // last UnpinInode deletes it. A crash leaves the orphan item: the next
  // writable open (or the kernel's mount) deletes the inode. Pins are
  // counted; they belong to this Filesystem object and are never stored.
  virtual void PinInode(InodeId id) { (void)id; }
  virtual Status UnpinInode(InodeId id) {
    (void)id;
    return Status::Ok();
  }
  // Makes every change so far durable (all or nothing on a crash). While it
  // waits for the device (writing the tree blocks, the flushes, the
  // superblocks), other threads' changes go on: they belong to the next
  // commit.
  virtual Status Commit() = 0;
  // fsync(2) / fdatasync(2) (datasync true) of one inode: when it returns,
  // the inode, its data and a name that reaches it survive a crash. Writes
  // a tree log (only this inode's changes and one superblock) where the
  // kernel would, a full Commit() where it falls back to one. Other
  // uncommitted changes may or may not survive a crash.
  virtual Status Fsync(InodeId id, bool datasync) {
    (void)id, (void)datasync;
    return Commit();
  }
  // Gives up every change since the last Commit: nothing more is committed
  // (closing commits nothing; every later change is EROFS), and with
  // OpenOptions::undo_uncommitted the bytes written since are put back.
  // Close the Filesystem after it. EROFS on a read-only open.
  virtual Status Discard() { return Status::Error(30 /* EROFS */, "discard is not supported here"); }
  // fallocate(2) on a regular file: mode 0 allocates (prealloc extents that
  // read as zeros) and extends the size; FALLOC_FL_KEEP_SIZE keeps it;
  // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE frees the range;
  // FALLOC_FL_ZERO_RANGE zeroes it (with or without KEEP_SIZE). Other modes
  // fail with EOPNOTSUPP.
  virtual Status Fallocate(InodeId file, int mode, uint64_t offset, uint64_t len) {
    (void)file, (void)mode, (void)offset, (void)len;
    return Status::Error(95 /* EOPNOTSUPP */, "fallocate is not supported here");
  }

  // ---- Subvolumes ----
  // The read-only flag of the subvolume whose top directory is `subvol`
  // (its ROOT_ITEM's RDONLY bit, as `btrfs property get SV ro`). EINVAL when
  // `subvol` is not the top of a subvolume.
  virtual Result<bool> SubvolumeReadOnly(InodeId subvol) {
    (void)subvol;
    return Status::Error(95 /* EOPNOTSUPP */, "subvolume flags are not supported here");
  }
  // Sets or clears it (`btrfs property set SV ro true|false`): while set,
  // every change inside the subvolume fails with EROFS.
  virtual Status SetSubvolumeReadOnly(InodeId subvol, bool read_only) {
    (void)subvol, (void)read_only;
    return Status::Error(95 /* EOPNOTSUPP */, "subvolume flags are not supported here");
  }
  // A snapshot of the subvolume whose top directory is `subvol`, made as
  // `name` in directory `dir` (`btrfs subvolume snapshot [-r]`). It shares
  // every tree block and data extent with the source until one side
  // changes them, and costs one tree block whatever the subvolume's size.
  // The running transaction is committed first and the snapshot after, as
  // the kernel does. Returns the snapshot's top directory. EINVAL when
  // `subvol` is not the top of a subvolume, EEXIST when the name is taken,
  // EROFS when `dir` is in a read-only subvolume.
  virtual Result<InodeId> CreateSnapshot(InodeId subvol, InodeId dir, std::string_view name, bool read_only) {
    (void)subvol, (void)dir, (void)name, (void)read_only;
    return Status::Error(95 /* EOPNOTSUPP */, "snapshots are not supported here");
  }
  // A new, empty subvolume `name` in directory `dir` (`btrfs subvolume
  // create`); its top directory takes attrs' mode, uid and gid. Committed
  // when the call returns.
  virtual Result<InodeId> CreateSubvolume(InodeId dir, std::string_view name, const NewInode& attrs) {
    (void)dir, (void)name, (void)attrs;
    return Status::Error(95 /* EOPNOTSUPP */, "subvolumes are not supported here");
  }
  // Deletes the subvolume or snapshot whose entry is `name` in `dir`
  // (`btrfs subvolume delete`): every block and extent only it held is
  // freed, shared ones keep their other owners. Committed when the call
  // returns; a crash leaves it gone, its space freed in steps that the next
  // writable open (or the kernel) finishes. EPERM for the default
  // subvolume, EBUSY for the one this view is opened at, ENOTEMPTY when it
  // holds other subvolumes, EINVAL when `name` is no subvolume.
  virtual Status DeleteSubvolume(InodeId dir, std::string_view name) {
    (void)dir, (void)name;
    return Status::Error(95 /* EOPNOTSUPP */, "subvolumes are not supported here");
  }
  // Every subvolume and snapshot but the top level, by id.
  virtual Result<std::vector<SubvolumeInfo>> ListSubvolumes() {
    return Status::Error(95 /* EOPNOTSUPP */, "subvolumes are not supported here");
  }
  // The subvolume the kernel mounts (and Open starts paths at) when no
  // subvol=/subvolid= is given: 5, the top level, unless set otherwise
  // (`btrfs subvolume get-default`).
  virtual Result<uint64_t> DefaultSubvolume() {
    return Status::Error(95 /* EOPNOTSUPP */, "subvolumes are not supported here");
  }
  // Makes subvolume `id` (5: the top level) the default, committed when the
  // call returns (`btrfs subvolume set-default`). This view keeps its paths.
  // ENOENT when `id` is no subvolume.
  virtual Status SetDefaultSubvolume(uint64_t id) {
    (void)id;
    return Status::Error(95 /* EOPNOTSUPP */, "subvolumes are not supported here");
  }

  // ---- Quotas ----
  // Counts every quota group anew from the extents and the subvolumes that
  // reach them, as `btrfs quota rescan` does, and clears the quota status's
  // INCONSISTENT flag; committed when the call returns. ENOENT when quotas
  // are off, EINVAL with simple quotas (always exact: nothing to rescan).
  virtual Status RescanQuotas() { return Status::Error(95 /* EOPNOTSUPP */, "quotas are not supported here"); }

  // ---- Reflinks ----
  // Makes [dst_offset, dst_offset + len) of `dst` share the data of
  // [src_offset, src_offset + len) of `src`, as the kernel's FICLONERANGE:
  // no data is copied and no data space is used; the two stay independent
  // (a later write to either is copied on write). `src` and `dst` may be one
  // file (ranges must not overlap) or lie in different subvolumes. Offsets
  // and len are whole sectors, except that a range ending at the end of
  // `src` may end there (the destination must then end there too or be
  // extended). len 0 means up to the end of `src`. `dst` grows to the end of
  // the range if shorter; its mtime and ctime are set. EISDIR for a
  // directory, EINVAL for other non-regular files, bad alignment, a range
  // past the end of `src`, overlapping ranges or files that differ in
  // NODATASUM; EPERM for an immutable `dst` or one with fs-verity; EROFS
  // when `dst` is in a read-only subvolume (`src` may be).
  virtual Status Clone(InodeId src, uint64_t src_offset, InodeId dst, uint64_t dst_offset, uint64_t len) {
    (void)src, (void)src_offset, (void)dst, (void)dst_offset, (void)len;
    return Status::Error(95 /* EOPNOTSUPP */, "reflinks are not supported here");
  }

  // ---- fs-verity ----
  // Makes `file` verifiable and its data unchangeable for good, as the
  // kernel's FS_IOC_ENABLE_VERITY: builds the Merkle tree of its data,
  // stores it and the descriptor in the file's items, and sets the file's
  // VERITY flag and the filesystem's verity feature. From then on Write, a
  // SetAttr size, Fallocate and a Clone into the file fail with EPERM;
  // renames, links, unlink, attributes and xattrs work as before. EEXIST
  // when it has verity already, EINVAL for bad params or a file that is not
  // regular, EROFS in a read-only subvolume. Joins the running transaction.
  virtual Status EnableVerity(InodeId file, const VerityParams& params) {
    (void)file, (void)params;
    return Status::Error(95 /* EOPNOTSUPP */, "fs-verity is not supported here");
  }
  // The file's verity descriptor; nullopt when it has none. EUCLEAN when
  // its items are damaged.
  virtual Result<std::optional<VerityInfo>> GetVerity(InodeId file) {
    (void)file;
    return std::optional<VerityInfo>();
  }
  // Reads the whole file and checks it against its Merkle tree and the
  // tree against the descriptor's root hash, as the kernel checks each
  // block it reads (Read does not). EIO naming the first data block that
  // does not match, or the tree's damage; ENODATA without fs-verity.
  virtual Status VerifyVerity(InodeId file) {
    (void)file;
    return Status::Error(95 /* EOPNOTSUPP */, "fs-verity is not supported here");
  }

  // For a caller that keeps regular files' mtime and ctime itself and sets
  // them with SetAttr: a FUSE mount with writeback caching, where the kernel
  // stamps them at write(2), fallocate(2), copy_file_range(2) and O_TRUNC
  // and sends its values later. Own stamps taken when the request arrives
  // would be a few milliseconds later than the kernel's, and stay stored
  // whenever the kernel has nothing newer to send. While on, Write, Clone,
  // Fallocate and a SetAttr size change leave both times as they are (times
  // given in the AttrChange are still set); everything else is unchanged.
  virtual void SetCallerKeepsFileTimes(bool on) { (void)on; }
};

}  // namespace ubtrfs

#endif  // UBTRFS_FILESYSTEM_H_
