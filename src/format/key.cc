#include "format/key.h"

#include <cstdio>

namespace ubtrfs::format {

std::string KeyTypeName(uint8_t type) {
  switch (type) {
    case kInodeItemKey: return "INODE_ITEM";
    case kInodeRefKey: return "INODE_REF";
    case kInodeExtrefKey: return "INODE_EXTREF";
    case kXattrItemKey: return "XATTR_ITEM";
    case kVerityDescItemKey: return "VERITY_DESC_ITEM";
    case kVerityMerkleItemKey: return "VERITY_MERKLE_ITEM";
    case kOrphanItemKey: return "ORPHAN_ITEM";
    case kDirLogItemKey: return "DIR_LOG_ITEM";
    case kDirLogIndexKey: return "DIR_LOG_INDEX";
    case kDirItemKey: return "DIR_ITEM";
    case kDirIndexKey: return "DIR_INDEX";
    case kExtentDataKey: return "EXTENT_DATA";
    case kExtentCsumKey: return "EXTENT_CSUM";
    case kRootItemKey: return "ROOT_ITEM";
    case kRootBackrefKey: return "ROOT_BACKREF";
    case kRootRefKey: return "ROOT_REF";
    case kExtentItemKey: return "EXTENT_ITEM";
    case kMetadataItemKey: return "METADATA_ITEM";
    case kExtentOwnerRefKey: return "EXTENT_OWNER_REF";
    case kTreeBlockRefKey: return "TREE_BLOCK_REF";
    case kExtentDataRefKey: return "EXTENT_DATA_REF";
    case kSharedBlockRefKey: return "SHARED_BLOCK_REF";
    case kSharedDataRefKey: return "SHARED_DATA_REF";
    case kBlockGroupItemKey: return "BLOCK_GROUP_ITEM";
    case kFreeSpaceInfoKey: return "FREE_SPACE_INFO";
    case kFreeSpaceExtentKey: return "FREE_SPACE_EXTENT";
    case kFreeSpaceBitmapKey: return "FREE_SPACE_BITMAP";
    case kDevExtentKey: return "DEV_EXTENT";
    case kDevItemKey: return "DEV_ITEM";
    case kChunkItemKey: return "CHUNK_ITEM";
    case kRaidStripeKey: return "RAID_STRIPE";
    case kQgroupStatusKey: return "QGROUP_STATUS";
    case kQgroupInfoKey: return "QGROUP_INFO";
    case kQgroupLimitKey: return "QGROUP_LIMIT";
    case kQgroupRelationKey: return "QGROUP_RELATION";
    case kTemporaryItemKey: return "TEMPORARY_ITEM";
    case kPersistentItemKey: return "PERSISTENT_ITEM";
    case kDevReplaceKey: return "DEV_REPLACE";
    case kUuidKeySubvol: return "UUID_KEY_SUBVOL";
    case kUuidKeyReceivedSubvol: return "UUID_KEY_RECEIVED_SUBVOL";
    case kStringItemKey: return "STRING_ITEM";
    default: return "UNKNOWN." + std::to_string(type);
  }
}

std::string ObjectidName(uint64_t id) {
  switch (id) {
    case kRootTreeObjectid: return "ROOT_TREE";
    case kExtentTreeObjectid: return "EXTENT_TREE";
    case kChunkTreeObjectid: return "CHUNK_TREE";
    case kDevTreeObjectid: return "DEV_TREE";
    case kFsTreeObjectid: return "FS_TREE";
    case kRootTreeDirObjectid: return "ROOT_TREE_DIR";
    case kCsumTreeObjectid: return "CSUM_TREE";
    case kQuotaTreeObjectid: return "QUOTA_TREE";
    case kUuidTreeObjectid: return "UUID_TREE";
    case kFreeSpaceTreeObjectid: return "FREE_SPACE_TREE";
    case kBlockGroupTreeObjectid: return "BLOCK_GROUP_TREE";
    case kRaidStripeTreeObjectid: return "RAID_STRIPE_TREE";
    case kBalanceObjectid: return "BALANCE";
    case kOrphanObjectid: return "ORPHAN";
    case kTreeLogObjectid: return "TREE_LOG";
    case kTreeLogFixupObjectid: return "TREE_LOG_FIXUP";
    case kTreeRelocObjectid: return "TREE_RELOC";
    case kDataRelocTreeObjectid: return "DATA_RELOC_TREE";
    case kExtentCsumObjectid: return "EXTENT_CSUM";
    case kFreeSpaceObjectid: return "FREE_SPACE";
    case kFreeInoObjectid: return "FREE_INO";
    case kMultipleObjectids: return "MULTIPLE";
    default: return std::to_string(id);
  }
}

std::string KeyToString(const Key& key) {
  // Offsets of -1 read better as such, as dump-tree prints them.
  std::string off = key.offset == UINT64_MAX ? "-1" : std::to_string(key.offset);
  std::string oid = key.objectid >= kFirstFreeObjectid && key.objectid <= kLastFreeObjectid
                        ? std::to_string(key.objectid)
                        : ObjectidName(key.objectid);
  return "(" + oid + " " + KeyTypeName(key.type) + " " + off + ")";
}

}  // namespace ubtrfs::format
