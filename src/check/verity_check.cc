#include "check/verity_check.h"

#include "format/verity.h"

namespace ubtrfs::check {

using format::Key;

void VerityItemsCheck::Add(const Key& key, std::span<const uint8_t> d) {
  any_ = true;
  if (key.type == format::kVerityMerkleItemKey) {
    // Only the offsets matter here: a tree is checked for gaps, not kept.
    if (key.offset != merkle_bytes_) {
      problems_.push_back("Merkle tree item at " + std::to_string(key.offset) + " where " +
                          std::to_string(merkle_bytes_) + " was due");
    }
    merkle_bytes_ = key.offset + d.size();
    return;
  }
  if (key.offset == 0) {
    head_ = d.size() >= sizeof(format::VerityDescriptorItem);  // a short one counts as none
    if (auto size = format::ParseVerityDescriptorHead(d); size.ok()) {
      desc_size_ = *size;
    } else {
      problems_.push_back(size.status().message());
    }
    return;
  }
  if (desc_.size() > format::kVerityMaxDescriptor) return;  // already reported
  Status s = format::AppendVerityItem(&desc_, 1, key.offset, d, "descriptor");
  if (!s.ok()) problems_.push_back(s.message());
}

std::vector<std::string> VerityItemsCheck::Finish(uint64_t isize) {
  std::vector<std::string> out = std::move(problems_);
  if (!head_) {
    out.push_back("the VERITY flag without a VERITY_DESC_ITEM");
  } else if (out.empty()) {
    if (desc_.size() != desc_size_) {
      out.push_back("descriptor items hold " + std::to_string(desc_.size()) + " of " + std::to_string(desc_size_) +
                    " bytes");
    } else if (auto d = format::ParseVerityDescriptor(desc_); !d.ok()) {
      out.push_back(d.status().message());
    } else {
      if (d->data_size != isize) {
        out.push_back("fs-verity descriptor for " + std::to_string(d->data_size) + " bytes, the file has " +
                      std::to_string(isize));
      }
      const uint64_t want = format::MerkleTreeSize(d->hash_algorithm, d->block_size, d->data_size);
      if (merkle_bytes_ != want) {
        out.push_back("Merkle tree of " + std::to_string(merkle_bytes_) + " bytes, " + std::to_string(want) +
                      " expected");
      }
    }
  }
  Reset();
  return out;
}

}  // namespace ubtrfs::check
