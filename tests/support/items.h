// Raw tree items for tests that build or change images below the public API.
#ifndef UBTRFS_TESTS_SUPPORT_ITEMS_H_
#define UBTRFS_TESTS_SUPPORT_ITEMS_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/ondisk.h"

namespace ubtrfs_test {

// An XATTR_ITEM body holding one name/value pair.
inline std::vector<uint8_t> XattrItem(const std::string& name, const std::string& value, uint64_t transid) {
  using ubtrfs::format::DirItem;
  std::vector<uint8_t> item(sizeof(DirItem) + name.size() + value.size());
  auto* di = reinterpret_cast<DirItem*>(item.data());
  di->transid = transid;
  di->data_len = static_cast<uint16_t>(value.size());
  di->name_len = static_cast<uint16_t>(name.size());
  di->type = ubtrfs::format::kFtXattr;
  std::memcpy(item.data() + sizeof(DirItem), name.data(), name.size());
  std::memcpy(item.data() + sizeof(DirItem) + name.size(), value.data(), value.size());
  return item;
}

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_ITEMS_H_
