// Delayed references: every change of an extent's back references in the
// running transaction is queued (QueueRef) and written into the extent tree
// at commit, one read-modify-write per extent however many of its
// references changed, as the kernel's delayed ref heads do.
//
// A reference goes inline in the extent item while the item stays below the
// kernel's BTRFS_MAX_EXTENT_ITEM_SIZE (a sixteenth of a leaf), and into an
// item of its own (TREE_BLOCK_REF, SHARED_BLOCK_REF, EXTENT_DATA_REF keyed by
// its hash, SHARED_DATA_REF) beyond that; the refs count of the extent item
// is the sum over both. An extent left with no reference is deleted.
#include <cstring>

#include "format/ondisk.h"
#include "txn/extent_refs.h"
#include "txn/transaction.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;
using tree::Cursor;

namespace {

size_t InlineSize(uint8_t type) {
  switch (type) {
    case kExtentDataRefKey:
      return 1 + sizeof(ExtentDataRef);
    case kSharedDataRefKey:
      return sizeof(ExtentInlineRef) + sizeof(SharedDataRef);
    default:
      return sizeof(ExtentInlineRef);
  }
}

bool IsDataRef(uint8_t type) { return type == kExtentDataRefKey || type == kSharedDataRefKey; }

// A keyed reference item found for one RefId, with its count.
struct KeyedRef {
  Key key;
  std::vector<uint8_t> body;
  uint32_t count = 1;
};

// The ref item of its own that carries `r` with `count`: its key (an
// EXTENT_DATA_REF at its hash; the caller moves it on a collision) and body.
std::pair<Key, std::vector<uint8_t>> KeyedItem(uint64_t bytenr, const TxnManager::RefId& r, int64_t count) {
  std::vector<uint8_t> body;
  uint64_t off = r.a;
  if (r.type == kExtentDataRefKey) {
    body.resize(sizeof(ExtentDataRef));
    auto* dr = reinterpret_cast<ExtentDataRef*>(body.data());
    dr->root = r.a;
    dr->objectid = r.ino;
    dr->offset = r.off;
    dr->count = static_cast<uint32_t>(count);
    off = ExtentDataRefHash(r.a, r.ino, r.off);
  } else if (r.type == kSharedDataRefKey) {
    body.resize(sizeof(SharedDataRef));
    reinterpret_cast<SharedDataRef*>(body.data())->count = static_cast<uint32_t>(count);
  }
  return {Key{bytenr, r.type, off}, std::move(body)};
}

InlineRef AsInline(const TxnManager::RefId& r, int64_t count) {
  InlineRef ir;
  ir.type = r.type;
  ir.offset = r.a;
  ir.root = r.a;
  ir.objectid = r.ino;
  ir.data_offset = r.off;
  ir.count = static_cast<uint32_t>(count);
  return ir;
}

}  // namespace

void TxnManager::QueueRef(uint64_t bytenr, bool tree, uint64_t size_or_level, const RefId& r, int64_t delta) {
  auto at = AtOrAfter(pending_, bytenr);
  if (at == pending_.end() || at->first != bytenr) at = pending_.emplace_hint(at, bytenr, PendingExtent{});
  PendingExtent& p = at->second;
  p.tree = tree;
  if (tree) {
    p.level = static_cast<int>(size_or_level);
  } else {
    p.num_bytes = size_or_level;
  }
  if (!tree && delta > 0 && p.owner == 0 && r.type == kExtentDataRefKey) p.owner = r.a;
  int64_t& d = p.refs[r];
  d += delta;
  if (d == 0) p.refs.erase(r);
}

Status TxnManager::DeleteTreeBlockItems(uint64_t bytenr, int level) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  // Every copied block comes here: the context is built only on a failure.
  auto where = [&] { return "dropping tree block " + std::to_string(bytenr); };
  Status st = ext->Delete(Key{bytenr, kMetadataItemKey, static_cast<uint64_t>(level)});
  if (st.code() == ENOENT) st = ext->Delete(OldTreeBlockKey(bytenr));  // a block from before skinny-metadata
  if (!st.ok()) return st.WithContext(where());
  if (auto it = tree_ref_items_.find(bytenr); it != tree_ref_items_.end()) {
    for (const Key& k : it->second) {
      if (Status st = ext->Delete(k); !st.ok()) return st.WithContext(where());
    }
    tree_ref_items_.erase(it);
  }
  return Status::Ok();
}

Status TxnManager::CreateExtent(uint64_t bytenr, const PendingExtent& p) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  // Without skinny-metadata a tree block's item is an EXTENT_ITEM with its
  // level and first key after the header, as the kernel writes it there.
  const bool old_form = p.tree && !skinny_metadata();
  const Key key = !p.tree   ? Key{bytenr, kExtentItemKey, p.num_bytes}
                  : old_form ? OldTreeBlockKey(bytenr)
                             : Key{bytenr, kMetadataItemKey, static_cast<uint64_t>(p.level)};
  auto where = [&] { return (p.tree ? "adding tree block " : "adding data extent ") + std::to_string(bytenr); };
  const size_t refs_start = sizeof(ExtentItem) + (old_form ? sizeof(TreeBlockInfo) : 0);
  std::vector<uint8_t> item(refs_start);
  if (old_form) {
    auto* info = reinterpret_cast<TreeBlockInfo*>(item.data() + sizeof(ExtentItem));
    info->level = static_cast<uint8_t>(p.level);
    // The key the block starts with now (the kernel's is the one it had when
    // allocated; neither it nor btrfs check reads it back).
    if (const tree::TreeBlock* b = dirty_->Peek(bytenr); b != nullptr && b->nritems() > 0) {
      const Key first = b->key(0);
      info->key.objectid = first.objectid;
      info->key.type = first.type;
      info->key.offset = first.offset;
    }
  }
  uint64_t owner = 0;
  if (!p.tree && simple_quotas()) {
    UB_ASSIGN_OR_RETURN(owner, NewDataOwner(p));
    if (owner != 0) {  // first, before every backref (its type sorts first)
      InlineRef o;
      o.type = kExtentOwnerRefKey;
      o.offset = owner;
      InsertInlineRef(item, {}, refs_start, o);
    }
  }
  uint64_t refs = 0;
  const size_t max_item = (vol_->nodesize() - sizeof(Header)) / 16 - sizeof(Item);
  std::vector<std::pair<Key, std::vector<uint8_t>>> keyed;
  for (const auto& [r, delta] : p.refs) {
    if (delta < 0) return Status::Error(EIO, "internal: " + where() + ": a reference dropped more often than added");
    if (delta > 1 && !IsDataRef(r.type)) return Status::Error(EIO, "internal: " + where() + ": a tree reference twice");
    refs += static_cast<uint64_t>(delta);
    if (item.size() + InlineSize(r.type) < max_item) {
      UB_ASSIGN_OR_RETURN(auto have, ParseInlineRefs(item, refs_start, key));
      InsertInlineRef(item, have, refs_start, AsInline(r, delta));
      continue;
    }
    // Too many for the item: a ref item of its own (the first free hash slot
    // for an EXTENT_DATA_REF is found when it is written below).
    keyed.push_back(KeyedItem(bytenr, r, delta));
  }
  auto* ei = reinterpret_cast<ExtentItem*>(item.data());
  ei->refs = refs;
  ei->generation = transid();
  ei->flags = (p.tree ? kExtentFlagTreeBlock : kExtentFlagData) | p.set_flags;
  if (Status st = ext->Insert(key, item); !st.ok()) return st.WithContext(where());
  for (auto& [k, body] : keyed) {
    Key at = k;
    while (!ext->Insert(at, body).ok()) {  // EEXIST: a hash collision of two data refs
      if (at.type != kExtentDataRefKey) return Status::Error(EIO, "internal: " + where() + ": duplicate ref item");
      ++at.offset;
    }
    if (p.tree) tree_ref_items_[bytenr].push_back(at);
  }
  if (!simple_quotas()) return Status::Ok();
  if (!p.tree) return SquotaDelta(owner, p.num_bytes, transid(), true);
  quotas_->new_blocks[bytenr] = p.owner;
  return SquotaDelta(p.owner, vol_->nodesize(), transid(), true);
}

Status TxnManager::ApplyExtent(uint64_t bytenr, const PendingExtent& p) {
  UB_ASSIGN_OR_RETURN(tree::TreeWriter * ext, Writer(kExtentTreeObjectid));
  UB_ASSIGN_OR_RETURN(Volume::TreeRoot * ext_root, vol_->MutableRoot(kExtentTreeObjectid));
  Key key = p.tree ? Key{bytenr, kMetadataItemKey, static_cast<uint64_t>(p.level)}
                   : Key{bytenr, kExtentItemKey, p.num_bytes};
  const std::string where = (p.tree ? "tree block " : "data extent ") + std::to_string(bytenr);
  std::vector<uint8_t> item;
  std::vector<std::pair<Key, std::vector<uint8_t>>> keyed;  // the extent's ref items
  bool old_form = false;
  {
    Cursor c(dirty_.get(), ext_root->ref);
    UB_RETURN_IF_ERROR(c.Seek(key));
    if (p.tree && (!c.Valid() || c.key() != key)) {
      // A block whose item predates skinny-metadata (any block of an image
      // without it; on one converted by btrfstune -x, those not yet rewritten).
      key = OldTreeBlockKey(bytenr);
      old_form = true;
      UB_RETURN_IF_ERROR(c.Seek(key));
    }
    if (!c.Valid() || c.key() != key) return Status::Corrupt(where + ": no extent item " + KeyToString(key));
    item.assign(c.data().begin(), c.data().end());
    for (;;) {
      UB_RETURN_IF_ERROR(c.Next());
      if (!c.Valid() || c.key().objectid != bytenr) break;
      const uint8_t t = c.key().type;
      if (t == kTreeBlockRefKey || t == kSharedBlockRefKey || t == kExtentDataRefKey || t == kSharedDataRefKey) {
        keyed.push_back({c.key(), std::vector<uint8_t>(c.data().begin(), c.data().end())});
      }
    }
  }
  const size_t refs_start = sizeof(ExtentItem) + (old_form ? sizeof(TreeBlockInfo) : 0);
  if (item.size() < refs_start) return Status::Corrupt(where + ": short extent item");
  const size_t max_item = (vol_->nodesize() - sizeof(Header)) / 16 - sizeof(Item);
  int64_t refs = static_cast<int64_t>(reinterpret_cast<ExtentItem*>(item.data())->refs.get());
  std::vector<Key> deleted;
  std::vector<std::pair<Key, std::vector<uint8_t>>> updated, added;
  // Keyed refs as they stand after earlier changes of this pass.
  auto find_keyed = [&](const RefId& r) -> std::pair<Key, std::vector<uint8_t>>* {
    for (auto& kv : keyed) {
      const Key& k = kv.first;
      if (k.type != r.type) continue;
      if (r.type == kExtentDataRefKey) {
        if (kv.second.size() < sizeof(ExtentDataRef)) continue;
        const auto* dr = reinterpret_cast<const ExtentDataRef*>(kv.second.data());
        if (dr->root.get() == r.a && dr->objectid.get() == r.ino && dr->offset.get() == r.off) return &kv;
      } else if (k.offset == r.a) {
        return &kv;
      }
    }
    return nullptr;
  };
  for (const auto& [r, delta] : p.refs) {
    refs += delta;
    UB_ASSIGN_OR_RETURN(auto inl, ParseInlineRefs(item, refs_start, key));
    InlineRef want = AsInline(r, delta);
    if (auto m = FindInlineRef(inl, want)) {
      const int64_t count = int64_t{m->count} + delta;
      if (count < 0 || (!IsDataRef(r.type) && count > 1)) {
        return Status::Corrupt(where + ": reference count of " + std::to_string(r.type) + " ref (" + std::to_string(r.a) +
                               (r.type == kExtentDataRefKey ? " " + std::to_string(r.ino) + " " + std::to_string(r.off) : "") +
                               ") below zero or doubled");
      }
      if (count == 0) {
        EraseInlineRef(item, *m);
      } else {
        SetInlineCount(item, *m, static_cast<uint32_t>(count));
      }
      continue;
    }
    if (auto* kv = find_keyed(r)) {
      uint32_t have = 1;
      if (r.type == kExtentDataRefKey) have = reinterpret_cast<ExtentDataRef*>(kv->second.data())->count.get();
      if (r.type == kSharedDataRefKey && kv->second.size() >= sizeof(SharedDataRef)) {
        have = reinterpret_cast<SharedDataRef*>(kv->second.data())->count.get();
      }
      const int64_t count = int64_t{have} + delta;
      if (count < 0 || (!IsDataRef(r.type) && count > 1)) {
        return Status::Corrupt(where + ": reference item " + KeyToString(kv->first) + " below zero or doubled");
      }
      if (count == 0) {
        deleted.push_back(kv->first);
        kv->first.type = 0;  // gone from this pass's view
      } else {
        if (r.type == kExtentDataRefKey) reinterpret_cast<ExtentDataRef*>(kv->second.data())->count = count;
        if (r.type == kSharedDataRefKey) reinterpret_cast<SharedDataRef*>(kv->second.data())->count = count;
        updated.push_back(*kv);
      }
      continue;
    }
    if (delta < 0) {
      return Status::Corrupt(where + ": dropping a reference it does not have (type " + std::to_string(r.type) +
                             ", " + std::to_string(r.a) + ")");
    }
    if (!IsDataRef(r.type) && delta > 1) return Status::Corrupt(where + ": a tree reference added twice");
    if (item.size() + InlineSize(r.type) < max_item) {
      InsertInlineRef(item, inl, refs_start, want);
      continue;
    }
    auto kv = KeyedItem(bytenr, r, delta);
    for (bool taken = true; taken && r.type == kExtentDataRefKey;) {  // a hash collision: the next free offset, as the kernel
      taken = false;
      for (const auto& k : keyed) taken |= k.first == kv.first;
      for (const auto& k : added) taken |= k.first == kv.first;
      if (taken) ++kv.first.offset;
    }
    added.push_back(kv);
    keyed.push_back(added.back());
  }
  if (refs < 0) return Status::Corrupt(where + ": reference count below zero");
  if (refs == 0) {
    // Nothing refers to it any more: the item and every ref item go.
    if (simple_quotas()) UB_RETURN_IF_ERROR(SquotaExtentDeleted(bytenr, p.tree, p.level, p.num_bytes, &item));
    UB_RETURN_IF_ERROR(ext->Delete(key).WithContext(where));
    for (const auto& kv : keyed) {
      if (kv.first.type == 0) continue;
      bool is_new = false;
      for (const auto& a : added) is_new |= a.first == kv.first;
      if (!is_new) UB_RETURN_IF_ERROR(ext->Delete(kv.first).WithContext(where));
    }
    for (const Key& k : deleted) UB_RETURN_IF_ERROR(ext->Delete(k).WithContext(where));
    if (p.tree) {
      tree_ref_items_.erase(bytenr);
      return Status::Ok();
    }
    UB_RETURN_IF_ERROR(space_->Free(bytenr, p.num_bytes));
    MarkGroupDirty(bytenr);
    return DeleteCsums(bytenr, p.num_bytes);
  }
  auto* ei = reinterpret_cast<ExtentItem*>(item.data());
  ei->refs = static_cast<uint64_t>(refs);
  ei->flags = ei->flags.get() | p.set_flags;
  UB_RETURN_IF_ERROR(ext->Update(key, item).WithContext(where));
  for (const Key& k : deleted) UB_RETURN_IF_ERROR(ext->Delete(k).WithContext(where));
  for (const auto& [k, body] : updated) UB_RETURN_IF_ERROR(ext->Update(k, body).WithContext(where));
  for (const auto& [k, body] : added) UB_RETURN_IF_ERROR(ext->Insert(k, body).WithContext(where));
  if (p.tree) {
    auto& list = tree_ref_items_[bytenr];
    for (const Key& k : deleted) std::erase(list, k);
    for (const auto& a : added) list.push_back(a.first);
    if (list.empty()) tree_ref_items_.erase(bytenr);
  }
  return Status::Ok();
}

Status TxnManager::RunDelayedRefs(bool* changed) {
  while (!pending_.empty() || !new_data_.empty()) {
    auto batch = std::move(pending_);
    pending_.clear();
    auto fresh_data = std::move(new_data_);
    new_data_.clear();
    // Data extents written in this transaction that no file kept (every
    // reference dropped again before the commit) leave nothing behind:
    // space and checksums go back.
    for (const auto& [bytenr, len] : fresh_data) {
      auto it = batch.find(bytenr);
      if (it == batch.end() || it->second.refs.empty()) {
        *changed = true;
        UB_RETURN_IF_ERROR(space_->Free(bytenr, len));
        MarkGroupDirty(bytenr);
        UB_RETURN_IF_ERROR(DeleteCsums(bytenr, len));
        if (it != batch.end()) batch.erase(it);
        continue;
      }
      it->second.fresh = true;
      it->second.num_bytes = len;
    }
    for (const auto& [bytenr, p] : batch) {
      if (p.refs.empty() && p.set_flags == 0) continue;
      *changed = true;
      if (p.fresh) {
        UB_RETURN_IF_ERROR(CreateExtent(bytenr, p));
        continue;
      }
      if (p.tree && p.base_refs >= 0) {
        int64_t sum = p.base_refs;
        for (const auto& [r, d] : p.refs) sum += d;
        if (sum == 0) {
          // The common case: a committed block with one reference, copied.
          if (simple_quotas()) UB_RETURN_IF_ERROR(SquotaExtentDeleted(bytenr, true, p.level, 0, nullptr));
          UB_RETURN_IF_ERROR(DeleteTreeBlockItems(bytenr, p.level));
          continue;
        }
      }
      UB_RETURN_IF_ERROR(ApplyExtent(bytenr, p));
    }
  }
  return Status::Ok();
}

}  // namespace ubtrfs::txn
