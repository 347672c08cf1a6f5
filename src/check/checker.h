// `ubtrfs check`: a read-only consistency check of a whole image, in the
// manner of `btrfs check --readonly` (original mode), written against our
// own tree/ and format/ layers (it never uses fs/).
//
// What is checked (see checker.cc for the details of each):
//  1. every tree reachable from the superblock (root, chunk, and every tree a
//     ROOT_ITEM names): each block is read and verified by the BlockReader
//     (checksum, bytenr, fsid, level, generation, item bounds, key order,
//     first key); the header owner must fit the tree;
//  2. extent references: every reachable tree block has its METADATA_ITEM /
//     EXTENT_ITEM with the backrefs its parents imply (TREE_BLOCK_REF of the
//     parent's owner, or SHARED_BLOCK_REF of a FULL_BACKREF parent); every
//     data extent named by EXTENT_DATA items has its EXTENT_ITEM whose
//     EXTENT_DATA_REF / SHARED_DATA_REF counts equal the file extent items
//     pointing at it; refs counts; no extent item nobody references
//     (check/backrefs.cc, with bounded memory);
//  3. chunks, block groups and dev extents agree; BLOCK_GROUP_ITEM.used is
//     the sum of the extents in the group; superblock bytes_used is the
//     total; no extent outside a block group, of the wrong type, or
//     overlapping another;
//  4. the free space tree: each block group's free ranges are the group
//     minus its extents (superblock stripes excepted, as btrfs check does);
//  5. fs trees: inode items, link counts, INODE_REF <-> DIR_ITEM/DIR_INDEX,
//     directory sizes, nbytes, file extent overlap and (without no-holes)
//     gaps, subvolume ROOT_REF/ROOT_BACKREF;
//  6. data checksums: every checksummed file extent has csums for all its
//     sectors, no csum item covers space without a data extent;
//  7. optionally (check_data_csum) the data itself against its checksums;
//  8. simple quotas: each qgroup is the sum of the extents it owns
//     (check/simple_quota.cc).
#ifndef UBTRFS_CHECK_CHECKER_H_
#define UBTRFS_CHECK_CHECKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "txn/volume.h"
#include "ubtrfs/check.h"
#include "ubtrfs/status.h"

namespace ubtrfs::check {

// The options and the result are the public API's (ubtrfs/check.h).
using ::ubtrfs::CheckOptions;
using ::ubtrfs::CheckResult;
using ::ubtrfs::CheckImage;
using ::ubtrfs::CheckJson;

// Checks an opened volume. Reads only; never writes.
CheckResult CheckVolume(txn::Volume& vol, const CheckOptions& options = {});

}  // namespace ubtrfs::check

#endif  // UBTRFS_CHECK_CHECKER_H_
