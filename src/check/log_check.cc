#include "check/log_check.h"

#include <cstring>
#include <set>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "tree/tree_block.h"

namespace ubtrfs::check {

using namespace ubtrfs::format;

namespace {

class LogChecker {
 public:
  LogChecker(txn::Volume& vol, const std::function<void(std::string)>& error,
             const std::function<void(std::string)>& warning)
      : vol_(vol), error_(error), warning_(warning) {}

  LogCheckCounts Run() {
    const SuperBlock& sb = vol_.super();
    if (sb.log_root_level >= kMaxLevel) {
      error_("tree log: superblock log_root_level " + std::to_string(sb.log_root_level) + " is out of range");
      return counts_;
    }
    std::vector<std::pair<Key, std::vector<uint8_t>>> roots;
    Walk(tree::BlockCheck{sb.log_root.get(), sb.log_root_level, sb.generation.get() + 1, {}}, "log root tree", 0,
         &roots);
    for (const auto& [k, d] : roots) {
      const std::string where = "tree log: log root tree item " + KeyToString(k);
      if (k.objectid != kTreeLogObjectid || k.type != kRootItemKey) {
        error_(where + ": not a log tree's root item");
        continue;
      }
      if (d.size() < kRootItemV1Size) {
        error_(where + ": short root item");
        continue;
      }
      RootItem ri{};
      std::memcpy(&ri, d.data(), std::min(d.size(), sizeof ri));
      const uint64_t id = k.offset;
      if (!IsSubvolumeTree(id)) {
        error_(where + ": a log for tree " + std::to_string(id) + ", which is no subvolume");
        continue;
      }
      if (ri.level >= kMaxLevel) {
        error_(where + ": level " + std::to_string(ri.level));
        continue;
      }
      if (!vol_.FindRoot(id).ok()) {
        warning_("tree log: a log of subvolume " + std::to_string(id) +
                 ", which does not exist (the replay frees it and skips it)");
      }
      ++counts_.log_trees;
      subvol_ = id;
      csum_ino_ = 0;
      std::vector<std::pair<Key, std::vector<uint8_t>>> items;
      Walk(tree::BlockCheck{ri.bytenr.get(), ri.level, ri.generation.get(), {}},
           "log tree of subvolume " + std::to_string(id), id, &items);
    }
    return counts_;
  }

 private:
  void Walk(const tree::BlockCheck& chk, const std::string& tree, uint64_t subvol,
            std::vector<std::pair<Key, std::vector<uint8_t>>>* items) {
    if (!seen_.insert(chk.bytenr).second) {
      error_("tree log: " + tree + ": block " + std::to_string(chk.bytenr) + " is reached twice");
      return;
    }
    auto b = vol_.reader()->Read(chk);
    if (!b.ok()) {
      error_("tree log: " + tree + ": " + b.status().message());
      return;
    }
    ++counts_.blocks;
    const tree::TreeBlock& blk = **b;
    if (!blk.is_leaf()) {
      for (int i = 0; i < blk.nritems(); ++i) {
        Walk(tree::BlockCheck{blk.child_bytenr(i), blk.level() - 1, blk.child_generation(i), blk.key(i)}, tree, subvol,
             items);
      }
      return;
    }
    for (int i = 0; i < blk.nritems(); ++i) {
      const Key k = blk.key(i);
      auto d = blk.item_data(i);
      ++counts_.items;
      if (subvol == 0) {
        items->push_back({k, std::vector<uint8_t>(d.begin(), d.end())});
        continue;
      }
      CheckItem(tree + ": item " + KeyToString(k), k, d);
    }
  }

  void CheckItem(const std::string& where, const Key& k, std::span<const uint8_t> d) {
    const uint32_t ss = vol_.sectorsize();
    auto bad = [&](const std::string& what) { error_("tree log: " + where + ": " + what); };
    switch (k.type) {
      case kInodeItemKey:
        if (d.size() < sizeof(InodeItem)) {
          bad("short inode item");
        } else if (!(reinterpret_cast<const InodeItem*>(d.data())->flags.get() & kInodeNodatasum)) {
          csum_ino_ = k.objectid;
        }
        break;
      case kInodeRefKey:
      case kInodeExtrefKey: {
        const size_t head = k.type == kInodeRefKey ? sizeof(InodeRef) : sizeof(InodeExtref);
        for (size_t at = 0; at < d.size();) {
          if (d.size() - at < head) return bad("short inode reference");
          const uint16_t len = k.type == kInodeRefKey
                                   ? reinterpret_cast<const InodeRef*>(d.data() + at)->name_len.get()
                                   : reinterpret_cast<const InodeExtref*>(d.data() + at)->name_len.get();
          if (len == 0 || len > 255 || head + len > d.size() - at) return bad("bad name length");
          at += head + len;
        }
        break;
      }
      case kDirIndexKey:
      case kDirItemKey:
      case kXattrItemKey: {
        size_t n = 0;
        for (size_t at = 0; at < d.size(); ++n) {
          if (d.size() - at < sizeof(DirItem)) return bad("short dir item");
          const auto* di = reinterpret_cast<const DirItem*>(d.data() + at);
          const size_t len = sizeof(DirItem) + di->name_len.get() + di->data_len.get();
          if (di->name_len.get() == 0 || len > d.size() - at) return bad("dir item overruns its item");
          at += len;
        }
        if (k.type == kDirIndexKey && n != 1) bad("a dir index item holds " + std::to_string(n) + " entries");
        break;
      }
      case kDirLogIndexKey:
      case kDirLogItemKey:
        if (d.size() < sizeof(uint64_t)) {
          bad("short dir log item");
        } else if (reinterpret_cast<const Le64*>(d.data())->get() < k.offset) {
          bad("range ends before it starts");
        }
        break;
      case kExtentDataKey: {
        if (d.size() < kFileExtentInlineDataStart) return bad("short file extent item");
        const auto* fe = reinterpret_cast<const FileExtentItem*>(d.data());
        if (fe->type == 0) break;
        if (fe->type > 2) return bad("unknown file extent type " + std::to_string(fe->type));
        if (d.size() < sizeof(FileExtentItem)) return bad("short file extent item");
        const uint64_t disk = fe->disk_bytenr.get(), len = fe->disk_num_bytes.get();
        if (fe->num_bytes.get() == 0 || fe->num_bytes.get() % ss || k.offset % ss) bad("unaligned extent");
        if (disk == 0) break;
        if (fe->type == kFileExtentReg && k.objectid == csum_ino_) {
          const bool whole = fe->compression != 0;  // compressed: the checksums cover the disk extent
          counts_.needs_csum.push_back({subvol_, k.objectid, k.offset, whole ? disk : disk + fe->offset.get(),
                                        whole ? len : fe->num_bytes.get()});
        }
        const alloc::ChunkInfo* c = vol_.chunks().Find(disk);
        if (disk % ss || len == 0 || len % ss || !c || !(c->type & kBlockGroupData) ||
            disk + len > c->logical + c->length) {
          bad("data extent " + std::to_string(disk) + " (" + std::to_string(len) +
              " bytes) is not inside a data chunk");
        } else {
          counts_.data_extents.emplace_back(disk, disk + len);
        }
        break;
      }
      case kExtentCsumKey: {
        const size_t csize = CsumSize(vol_.csum_type());
        if (k.objectid != kExtentCsumObjectid || d.empty() || d.size() % csize || k.offset % ss) {
          bad("malformed checksums");
        } else {
          counts_.log_csums.emplace_back(k.offset, k.offset + d.size() / csize * ss);
        }
        break;
      }
      default:
        break;
    }
  }

  txn::Volume& vol_;
  const std::function<void(std::string)>& error_;
  const std::function<void(std::string)>& warning_;
  std::set<uint64_t> seen_;
  LogCheckCounts counts_;
  uint64_t subvol_ = 0;    // of the log tree being walked
  uint64_t csum_ino_ = 0;  // the last logged inode with checksums (its INODE_ITEM comes first)
};

}  // namespace

LogCheckCounts CheckTreeLog(txn::Volume& vol, const std::function<void(std::string)>& error,
                            const std::function<void(std::string)>& warning) {
  return LogChecker(vol, error, warning).Run();
}

}  // namespace ubtrfs::check
