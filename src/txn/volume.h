// An opened btrfs filesystem over one or more devices: the chosen
// superblock, the device set, the chunk map, the tree block reader, the roots
// of the root tree, and data reads with checksum verification. Thread-safe
// after Open().
#ifndef UBTRFS_TXN_VOLUME_H_
#define UBTRFS_TXN_VOLUME_H_

#include <functional>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "alloc/chunk_io.h"
#include "alloc/chunk_map.h"
#include "format/ondisk.h"
#include "io/block_device.h"
#include "io/device_set.h"
#include "tree/block_reader.h"
#include "tree/cursor.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::txn {

struct VolumeOptions {
  size_t node_cache_bytes = 64ull << 20;
  bool verify_data_csums = true;
  bool writable = false;
  // Writable although devices are missing (the kernel's -o degraded).
  bool degraded = false;
  // Read-only rescue fallbacks; the Volume takes usebackuproot,
  // ignorebadroots, ignoremetacsums and ignoresuperflags (txn/volume_rescue.cc),
  // the Filesystem above it the rest.
  RescueOptions rescue;
  // Read-only: open as far as the chunk tree and stop, for what looks for
  // tree blocks by address where the root tree is lost (inspect find-root).
  // Only super(), chunks(), chunk_io(), reader() and devices() are for use.
  bool chunks_only = false;
};

class Volume {
 public:
  // Takes the device, picks a valid superblock (the primary, else the best
  // mirror, with a warning), loads the chunk tree and checks features.
  static Result<std::unique_ptr<Volume>> Open(std::unique_ptr<io::BlockDevice> dev, const VolumeOptions& options);
  // Several devices of one filesystem, in any order: each is matched to its
  // devid by its superblock (all must carry the first one's fsid). Devices
  // the chunk tree lists but that are not given are missing: read-only
  // opens go on (reads use the other copies or parity), writable ones need
  // options.degraded.
  static Result<std::unique_ptr<Volume>> Open(std::vector<std::unique_ptr<io::BlockDevice>> devs,
                                              const VolumeOptions& options);

  const format::SuperBlock& super() const { return super_; }
  int super_mirror() const { return super_mirror_; }
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Something the user should hear once (a change the open made).
  void AddWarning(std::string w) { warnings_.push_back(std::move(w)); }
  // Ends a Volume and hands back its device (to open it again, e.g. after
  // the tree-log replay committed).
  static std::vector<std::unique_ptr<io::BlockDevice>> TakeDevices(std::unique_ptr<Volume> v);
  uint32_t sectorsize() const { return super_.sectorsize.get(); }
  uint32_t nodesize() const { return super_.nodesize.get(); }
  uint16_t csum_type() const { return super_.csum_type.get(); }
  // Committed blocks only (verified reads, node cache).
  tree::BlockReader* reader() { return reader_.get(); }
  // The current view: inside a running transaction its dirty blocks first.
  tree::BlockSource* source() { return source_ ? source_ : reader_.get(); }
  void SetSource(tree::BlockSource* s) { source_ = s; }
  // Where readers find the root of a tree that a running transaction may be
  // changing from other threads (a writer's live root, tree::LiveRoot);
  // trees it does not cover are read from their ROOT_ITEM copy.
  using LiveRootFn = std::function<Result<tree::RootPtr>(uint64_t objectid)>;
  void SetLiveRoots(LiveRootFn fn) { live_roots_ = std::move(fn); }
  format::SuperBlock& mutable_super() { return super_; }
  tree::RootPtr* mutable_root_tree() { return &root_tree_; }
  // The chunk tree's root as the running transaction moves it; the
  // superblock follows it at WriteSuperblocks().
  tree::RootPtr* mutable_chunk_tree() { return &chunk_tree_; }
  const alloc::ChunkMap& chunks() const { return *chunks_; }
  alloc::ChunkMap* mutable_chunks() { return chunks_.get(); }  // new chunks (txn/chunk_alloc)
  io::DeviceSet& devices() { return *devs_; }
  alloc::ChunkIo& chunk_io() { return *io_; }
  // Devids the chunk tree lists that were not opened.
  const std::vector<uint64_t>& missing_devices() const { return missing_; }
  // Each device's DEV_ITEM as the chunk tree has it (new chunks change
  // bytes_used); superblocks carry their device's.
  const std::map<uint64_t, format::DevItem>& dev_items() const { return dev_items_; }
  format::DevItem* mutable_dev_item(uint64_t devid);
  // A seed device under a sprouted filesystem (its DEV_ITEM carries the
  // seed's fsid): read, never written. It gets no chunk and no superblock,
  // and the groups of its chunks are read-only (txn/block_groups.cc), as
  // the kernel treats it.
  bool IsSeedDevice(uint64_t devid) const;
  bool sprouted() const;
  // Offline device add and remove (txn/relocate.cc): a device joins the set
  // with its DEV_ITEM, or leaves it (handed back, to wipe its superblocks).
  // The caller changes the chunk tree and the superblock, and commits. Both
  // take SuperLock().
  Status AddDevice(std::unique_ptr<io::BlockDevice> dev, const format::DevItem& item);
  std::unique_ptr<io::BlockDevice> RemoveDevice(uint64_t devid);
  // Device replace: `dev` serves `devid` from now on (no longer missing),
  // its DEV_ITEM with `uuid`; the old device (null if missing) comes back.
  std::unique_ptr<io::BlockDevice> ReplaceDevice(uint64_t devid, std::unique_ptr<io::BlockDevice> dev,
                                                 const uint8_t* uuid);

  tree::RootPtr root_tree() const { return root_tree_; }
  tree::RootPtr chunk_tree() const;
  // The root of tree `objectid` from its ROOT_ITEM (the newest one), with the
  // item itself. NotFound when there is none.
  struct TreeRoot {
    tree::RootPtr ref;
    format::RootItem item{};  // zero-filled past what the on-disk item holds
    format::Key item_key;     // where the ROOT_ITEM sits in the root tree
    uint32_t item_size = 0;   // its size on disk (v1 items are shorter)
    bool dirty = false;       // moved in the running transaction
    bool deleted = false;     // dropped (subvolume deletion): NotFound from now on
  };
  Result<TreeRoot> FindRoot(uint64_t objectid);
  // The cached entry itself, for the transaction layer to move roots in
  // place (entries never move once created).
  // A dead tree (deleted, or a subvolume whose ROOT_ITEM has refs 0: being
  // dropped) is NotFound unless `even_deleted`.
  Result<TreeRoot*> MutableRoot(uint64_t objectid, bool even_deleted = false);
  // Guards the fields of cached TreeRoot entries (MutableRoot).
  std::mutex& roots_mutex() { return roots_mu_; }
  // Every tree root loaded so far.
  std::vector<uint64_t> LoadedRoots();
  // Writes the superblock (checksummed) to every copy each present device
  // has room for, each with its own DEV_ITEM: SealSuperblocks() then
  // WriteSealedSuperblocks(), for callers that have the volume to
  // themselves.
  Status WriteSuperblocks();
  // A commit's superblocks, one per device, taken from the running state
  // while the commit still holds it (the root pointers, each DEV_ITEM), to
  // be written after the commit's flush, when the next transaction may
  // already be changing that state (txn/commit_tail.h).
  struct SealedSupers {
    std::vector<std::pair<uint64_t, format::SuperBlock>> per_device;  // devid, its copy
    format::SuperBlock committed{};  // what WriteLogSuperblock starts from once they are written
  };
  SealedSupers SealSuperblocks();
  Status WriteSealedSuperblocks(const SealedSupers& s);
  // Held by whatever puts a superblock on the devices or changes the set
  // they are (a commit from its start until its superblocks are flushed, a
  // tree log's sync, device add and remove): one at a time, in order, and
  // never a tree log's superblock ahead of the commit it follows.
  std::unique_lock<std::mutex> SuperLock() { return std::unique_lock(super_mu_); }
  // An fsync's tree log (src/log/tree_log.h): the superblock as last
  // committed, pointing at the log root, written to the primary copy only
  // (of every device, as the kernel's log commit does; the mirrors keep the
  // committed state).
  Status WriteLogSuperblock(uint64_t log_root, uint8_t log_root_level);

  // Reads `out.size()` bytes of data at `logical` (both sector aligned),
  // verifying data checksums where the csum tree has them and `verify` is
  // set; a sector that fails on one mirror is read from the next.
  Status ReadData(uint64_t logical, std::span<uint8_t> out, bool verify);
  // The same bytes in place, mirror 0 of an image file mapped into memory
  // (io/mapped_read.h), checked as ReadData checks them. Empty where they
  // are not mappable, a page does not read or a checksum fails: the caller
  // then reads them with ReadData, which tries the other mirrors and names
  // the error.
  Result<io::MappedBytes> MapData(uint64_t logical, size_t len, bool verify);
  // Checksums for the sectors of [logical, logical + n * sectorsize): one
  // entry per sector, empty where the csum tree has none.
  Status LookupCsums(uint64_t logical, size_t nsectors, std::vector<uint8_t>* csums, std::vector<bool>* present);
  bool verify_data_csums() const { return options_.verify_data_csums; }
  bool writable() const { return options_.writable; }

 private:
  explicit Volume(const VolumeOptions& options) : options_(options) {}
  Status LoadDevices(std::vector<std::unique_ptr<io::BlockDevice>> devs);
  format::SuperBlock SuperFor(const format::SuperBlock& base, uint64_t devid) const;
  Status WriteSuperCopy(io::BlockDevice* dev, format::SuperBlock sb, int mirror);
  Status LoadChunks();
  Status CheckFeatures();
  Status CheckDevices();
  // The root tree's root block must read; with use_backup_root the newest
  // backup root that reads takes its place (txn/volume_rescue.cc).
  Status LoadRootTree();
  // The csum tree's ROOT_ITEM and root block; with ignore_bad_roots a bad
  // one is left out and file data goes unverified.
  Status LoadCsumRoot();
  // A superblock flag the kernel refuses: `what` refused, or a warning when
  // a read-only open asked for ignore_super_flags.
  Status RefusedSuperFlag(const std::string& what);

  std::unique_ptr<io::DeviceSet> devs_;
  std::unique_ptr<alloc::ChunkIo> io_;
  std::map<uint64_t, format::DevItem> dev_items_;
  std::vector<uint64_t> missing_;
  // Seed devices given with a filesystem sprouted from them, by devid: the
  // seed's fsid (the sprout's DEV_ITEM names it) and the fsid its blocks
  // carry (its metadata uuid, when it has one).
  struct Seed {
    std::array<uint8_t, format::kFsidSize> fsid, metadata_fsid;
  };
  std::map<uint64_t, Seed> seeds_;
  VolumeOptions options_;
  format::SuperBlock super_{};
  std::mutex super_mu_;  // SuperLock()
  format::SuperBlock committed_super_{};  // as on the device: the log's superblock starts from it; super_mu_
  int super_mirror_ = 0;
  std::vector<std::string> warnings_;
  std::unique_ptr<alloc::ChunkMap> chunks_;
  std::unique_ptr<tree::BlockReader> reader_;
  bool csum_tree_ignored_ = false;  // LoadCsumRoot left a bad csum tree out

  std::mutex roots_mu_;  // guards roots_
  std::map<uint64_t, TreeRoot> roots_;
  tree::RootPtr root_tree_;
  tree::RootPtr chunk_tree_;
  tree::BlockSource* source_ = nullptr;
  LiveRootFn live_roots_;
};

}  // namespace ubtrfs::txn

#endif  // UBTRFS_TXN_VOLUME_H_
