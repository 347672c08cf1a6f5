// What dump-tree's printer lends to the other printers of src/inspect/.
#ifndef UBTRFS_INSPECT_DUMP_TREE_H_
#define UBTRFS_INSPECT_DUMP_TREE_H_

#include <cstdint>
#include <cstdio>
#include <span>

#include "format/ondisk.h"

namespace ubtrfs::inspect {

// "\titem N key (...)" and, when `chunk` holds one, the CHUNK_ITEM below it
// as dump-tree prints one: a superblock's sys_chunk_array entry.
void PrintSysArrayItem(std::FILE* out, int index, const format::DiskKey& key, std::span<const uint8_t> chunk);

}  // namespace ubtrfs::inspect

#endif  // UBTRFS_INSPECT_DUMP_TREE_H_
