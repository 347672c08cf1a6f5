// Offline resizing of a filesystem in an image file (or on a block device):
// `ubtrfs resize` and `ubtrfs mkfs --shrink`; adding a device to a
// filesystem, removing or replacing one (`ubtrfs device add|remove|
// replace`); and converting chunks to another profile (`ubtrfs balance`).
// Nothing may have the images open meanwhile (no mount).
#ifndef UBTRFS_RESIZE_H_
#define UBTRFS_RESIZE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ubtrfs/export_macros.h"
#include "ubtrfs/status.h"

namespace ubtrfs {

struct ResizeTarget {
  enum Kind {
    kBytes,     // exactly `bytes`
    kGrowBy,    // the current size plus `bytes`
    kShrinkBy,  // the current size less `bytes`
    kMax,       // the whole image file or device
    kMin,       // the smallest size that holds the chunks once moved down
  };
  Kind kind = kBytes;
  uint64_t bytes = 0;
};

// A byte count with an optional binary unit, as `mkfs --size` and `resize`
// take it: "65536", "64k", "512M", "512MiB", "1G", "2T" (K, M, G, T, P, E:
// powers of 1024, either case, optionally followed by B or iB). EINVAL for
// anything else, ERANGE past 2^64 - 1, with a message quoting `text`.
UBTRFS_API Status ParseByteSize(std::string_view text, uint64_t* bytes);

// "10G", "+512M", "-1G", "max", "min" (sizes as ParseByteSize takes them).
UBTRFS_API Status ParseResizeTarget(std::string_view text, ResizeTarget* out);

// Every copy of a chunk that resize, device remove and replace, and balance
// move or make is verified as it is read, as the kernel's replace does:
// each tree block (checksum, bytenr, fsid, structure) and each data sector
// the csum tree has a checksum for. One that fails is taken from another
// copy of its chunk (a mirror, or RAID5/6 parity) that passes; with none,
// it is copied as read and named here (`ubtrfs scrub` and `check` find it
// too). Where a RAID5/6 stripe is copied row by row (resize, device
// remove and replace), its P and Q elements are copied as they are.
struct CopyCheck {
  uint64_t repaired = 0;       // tree blocks and data sectors taken from another copy
  uint64_t unrecoverable = 0;  // those no copy of which verified
  // What failed, by logical address, and any range left unverified as its
  // extent or csum tree could not be read (the first 100 lines).
  std::vector<std::string> errors;
};

struct ResizeResult {
  uint64_t old_bytes = 0;       // the filesystem's size before
  uint64_t new_bytes = 0;       // and after (the image file is cut or extended to it)
  uint64_t stripes_moved = 0;   // chunk copies moved down the device
  uint64_t bytes_copied = 0;    // bytes those moves copied
  uint64_t bytes_trimmed = 0;   // device bytes taken from chunks' unused tails (ShrinkImageToFit)
  CopyCheck copy_check;         // what those moves read
};

// Grows or shrinks the filesystem in `path` to `target`, committing each
// step. Growing extends an image file first. Shrinking moves every chunk
// copy that lies past the new end into free device space below it (its
// bytes copied, the chunk and dev extent items changed; logical addresses,
// and so every reference, stay as they are), then cuts the image file.
// When the chunks do not fit below the new end, EINVAL names the chunk that
// does not and the smallest size `min` can reach; nothing has changed then
// but moves already committed.
UBTRFS_API Status ResizeImage(const std::string& path, const ResizeTarget& target, ResizeResult* result);

// mkfs --shrink: cuts every chunk to what it holds (keeping the metadata
// the kernel's global reserve needs), moves the copies down to the lowest
// free places, and cuts the image file at the end of the last one.
UBTRFS_API Status ShrinkImageToFit(const std::string& path, ResizeResult* result);

// ---- Devices ----

struct DeviceChangeOptions {
  // Where to look for the filesystem's other devices (as OpenOptions::scan_dirs).
  std::vector<std::string> scan_dirs;
  // AddDevice: overwrite a btrfs filesystem on the new device.
  bool force = false;
  // Go on although devices of the filesystem are missing (the kernel's
  // -o degraded); ENODEV without it. RemoveDevice of a missing device
  // needs no flag: naming it asks for it.
  bool degraded = false;
};

struct DeviceChangeResult {
  uint64_t devid = 0;          // the device added or removed
  uint64_t num_devices = 0;    // the filesystem's devices afterwards
  uint64_t total_bytes = 0;    // and its size
  uint64_t stripes_moved = 0;     // RemoveDevice: chunk stripes moved to the other devices
  uint64_t chunks_restriped = 0;  // RAID0/RAID10 chunks laid out anew over fewer devices
  uint64_t bytes_copied = 0;      // bytes those moves copied (ReplaceDevice: the copy)
  CopyCheck copy_check;           // what they read
};

// Adds `new_device` (an image file or block device that exists, at least
// 16 MiB) to the filesystem over `devices` (every device, "IMG1,IMG2,..."
// entries as Filesystem::Open takes, or one with scan_dirs), in one commit:
// its DEV_ITEM (devid one above the highest), the superblocks' device count
// and size, and its own superblock copies. Its first MiB is wiped. Nothing
// moves: new chunks use it from now on (as the kernel's btrfs device add
// without a balance). EINVAL for a device of this filesystem, EEXIST-like
// EINVAL for another btrfs without options.force; nothing changes then.
UBTRFS_API Status AddDevice(const std::vector<std::string>& devices, const std::string& new_device,
                            const DeviceChangeOptions& options, DeviceChangeResult* result);

// Removes a device (`which`: its devid, its path as named or found, or
// "missing": the first device the filesystem lists that is not there) from
// the filesystem over `devices`: every chunk stripe on it moves to another
// device first (one commit per stripe, as ResizeImage moves them; a stripe
// of a missing device is made again from its chunk's other copies or
// parity, as the kernel's `btrfs device remove missing` does), then
// one commit drops its DEV_ITEM and shrinks the device count and size, and
// the magic of its superblock copies is cleared. Refused (EINVAL, nothing
// changed) for the only device and where a profile in use would have fewer
// devices than it needs (as the kernel: RAID1 keeps 2, RAID1C3 3, RAID1C4 4,
// RAID10 2). A RAID0 or RAID10 chunk that already has a stripe on every
// other device is restriped over them (same logical address and length,
// fewer and longer stripes, every used element copied), which needs room
// for the new stripes beside the old ones; without it EINVAL names the
// chunk and nothing more changes. A missing device whose chunks cannot be
// rebuilt (SINGLE, DUP or RAID0 data on it, or more devices missing than a
// profile tolerates) is refused with EINVAL before anything moves, unless
// those chunks are empty.
UBTRFS_API Status RemoveDevice(const std::vector<std::string>& devices, const std::string& which,
                               const DeviceChangeOptions& options, DeviceChangeResult* result);

// Replaces a device (`which` as RemoveDevice takes it; present or
// missing) by `new_device` (as AddDevice takes it, at least as large as
// the device's size in the filesystem), as `btrfs replace start`: the new
// device takes the old one's devid and every chunk stripe it had, each
// copied to the same place on it (from the old device, or made again from
// the other copies or parity where it is missing or a read fails), in one
// commit after the copying; the old device's superblocks lose their magic.
// result->devid is the devid, bytes_copied what was copied. EINVAL for a
// smaller device, or a missing device whose chunks in use cannot be
// rebuilt; nothing changes then.
UBTRFS_API Status ReplaceDevice(const std::vector<std::string>& devices, const std::string& which,
                                const std::string& new_device, const DeviceChangeOptions& options,
                                DeviceChangeResult* result);

// Grows or shrinks one device (`devid`) of the filesystem over `devices`
// (as AddDevice takes them) to `target`, as `btrfs filesystem resize
// DEVID:SIZE` does, offline; ResizeResult's sizes are that device's.
// Growing extends its image file first. Shrinking moves each chunk stripe
// past the new end below it on the same device, or where it does not fit
// there, to another device that holds no other stripe of its chunk (one
// commit per stripe), then cuts the image file. `min`: the device's
// stripes moved down as far as they go, and the device cut after the last.
// EINVAL names a stripe that fits nowhere; moves already committed stay.
UBTRFS_API Status ResizeDevice(const std::vector<std::string>& devices, uint64_t devid, const ResizeTarget& target,
                               const DeviceChangeOptions& options, ResizeResult* result);

// ---- Balance filters ----

// Which block groups of a kind a balance takes, as btrfs balance's usage
// filter: `usage=N` takes those less than N percent used (0: only empty ones);
// `usage=MIN..MAX` those from MIN up to (not including) MAX percent.
struct UsageFilter {
  bool on = false;
  uint32_t min_percent = 0;
  uint32_t max_percent = 0;
  bool operator==(const UsageFilter&) const = default;
};

// Parses "usage=N" or "usage=MIN..MAX" (N, MIN, MAX from 0 to 100).
UBTRFS_API Status ParseUsageFilter(std::string_view text, UsageFilter* out);

// btrfs balance's other filters for a kind. A group is taken when it has a
// stripe on device `devid` (devid=N; 0: any device), when such a stripe
// overlaps device bytes [drange_start, drange_end) (drange=S..E, with
// devid), and when its logical range overlaps [vrange_start, vrange_end)
// (vrange=S..E). Of those the usage filter also takes, at most limit_max
// are emptied, lowest use first, and none unless at least limit_min
// qualify (limit=N, limit=MIN..MAX), as the kernel counts them.
struct GroupFilter {
  bool on = false;  // one of these was given: the kind is balanced even without a usage filter
  uint64_t devid = 0;
  bool drange = false;
  uint64_t drange_start = 0, drange_end = 0;
  bool vrange = false;
  uint64_t vrange_start = 0, vrange_end = 0;
  uint64_t limit_min = 0, limit_max = UINT64_MAX;
  bool operator==(const GroupFilter&) const = default;
};

// Parses btrfs-progs' comma-separated filters of one kind, as `btrfs
// balance start -d`/`-m` takes them ("usage=50,limit=2", "devid=2,drange=
// 0..1G", "convert=raid1,soft"): usage, limit, devid, drange, vrange
// (sizes with K/M/G/T suffixes, ranges as S..E, S.. or ..E), convert (the
// profile into *convert) and soft (accepted: conversion always leaves the
// chunks already in the target profile alone). A profile alone is taken as
// convert=PROFILE.
UBTRFS_API Status ParseBalanceFilters(std::string_view text, UsageFilter* usage, GroupFilter* groups,
                                      std::string* convert);

// ---- Profiles ----

struct ConvertOptions {
  // Where to look for the filesystem's other devices, and whether devices
  // may be missing (as DeviceChangeOptions).
  std::vector<std::string> scan_dirs;
  bool degraded = false;
  // Target profiles by chunk kind, as btrfs balance's -dconvert, -mconvert
  // and -sconvert take them ("single", "dup", "raid0", "raid1", "raid1c3",
  // "raid1c4", "raid10", "raid5", "raid6"); empty: that kind stays. System
  // chunks follow metadata when only that is given, as btrfs-progs does.
  std::string data, metadata, system;
  // Allow metadata or system chunks to keep fewer copies than before.
  bool force = false;
  // Which chunks of data and metadata convert (`-dconvert=raid1,usage=50`):
  // all without filters; with them, as RelocateOptions takes groups.
  UsageFilter data_usage, metadata_usage;
  GroupFilter data_groups, metadata_groups;
};

struct ConvertResult {
  uint64_t chunks_converted = 0;
  uint64_t bytes_copied = 0;
  CopyCheck copy_check;  // what the conversions read
};

// `btrfs balance start -dconvert=... -mconvert=...`, offline: every chunk of
// each kind asked for that has another profile is laid out anew as the
// target profile over the devices (same logical address and length, its
// used bytes copied; one commit per chunk), and new chunks of that kind get
// it too. EINVAL, with nothing changed, for an unknown profile, one that
// needs more devices than the filesystem has, or less metadata redundancy
// without options.force. The data and metadata filters (usage, limit,
// devid, drange, vrange) choose which chunks convert, as RelocateGroups
// chooses groups. ENOSPC names a chunk whose new stripes do not fit
// beside the old ones; the chunks converted before it stay converted (a
// filesystem with mixed profiles, as after an interrupted balance).
UBTRFS_API Status ConvertProfiles(const std::vector<std::string>& devices, const ConvertOptions& options,
                                  ConvertResult* result);

// ---- Emptying block groups ----

struct RelocateOptions {
  // As DeviceChangeOptions.
  std::vector<std::string> scan_dirs;
  bool degraded = false;
  UsageFilter data, metadata;
  GroupFilter data_groups, metadata_groups;
};

struct RelocateResult {
  uint64_t groups_selected = 0;  // block groups the filters took
  uint64_t groups_emptied = 0;   // emptied and deleted with their chunks
  uint64_t data_extents = 0;     // data extents copied to new places
  uint64_t data_bytes = 0;
  uint64_t tree_blocks = 0;      // tree blocks copied on write
  uint64_t chunk_bytes_before = 0;  // device bytes the data and metadata chunks took
  uint64_t chunk_bytes_after = 0;
  // Why a selected group stayed (an extent nothing reaches, data that did
  // not read back verified from any copy, the last group of its kind).
  std::vector<std::string> notes;
};

// `btrfs balance start -dusage=N -musage=N`, offline: each data and metadata
// block group the filters take (lowest use first; mixed ones by either
// filter, which must then agree, else EINVAL; not system or
// read-only ones) is emptied by moving its extents elsewhere (new logical
// addresses: file extent items, checksums, tree pointers and references
// follow, in every snapshot that shares them), then deleted with its chunk,
// one group at a time. Groups made meanwhile are not taken. ENOSPC when a
// copy finds no room; the groups emptied before stay emptied. EINVAL with
// simple quotas (a moved extent would be counted anew) or a device missing
// (the new chunks would lack its copies, the old ones could not go).
UBTRFS_API Status RelocateGroups(const std::vector<std::string>& devices, const RelocateOptions& options,
                                 RelocateResult* result);

// The smallest image that holds what an existing image holds (`ubtrfs
// resize --shrink`): first every data and metadata block group not full is
// packed into as few new ones as hold it (RelocateGroups with usage=100 for
// both kinds), then ShrinkImageToFit. Packing that is refused (simple
// quotas) or finds no room is noted, and the chunks are cut and moved as
// they are. EINVAL for several devices, and for relocation trees a kernel
// balance left (the kernel needs room to merge them at its next mount).
struct ShrinkResult {
  RelocateResult packed;
  ResizeResult resize;
  std::vector<std::string> notes;  // why the groups were not packed (all)
};
UBTRFS_API Status ShrinkImage(const std::string& path, ShrinkResult* result);

}  // namespace ubtrfs

#endif  // UBTRFS_RESIZE_H_
