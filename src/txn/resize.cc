// ubtrfs resize and mkfs --shrink (ubtrfs/resize.h) over txn::DeviceLayout
// (relocate.cc): one image, or one device of several.
#include "ubtrfs/resize.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "format/ondisk.h"
#include "txn/extent_relocation.h"
#include "txn/offline_open.h"
#include "txn/relocate.h"
#include "txn/transaction.h"
#include "txn/volume.h"

namespace ubtrfs {

namespace {

using txn::IsRegular;
using txn::Opened;
using txn::SetFileSize;

std::string Mib(uint64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return buf;
}

std::string KindText(uint64_t type) {
  if (type & format::kBlockGroupData) return "data";
  if (type & format::kBlockGroupSystem) return "system";
  return "metadata";
}

// One resize of the image at `path`, from Begin (the lock, what the path
// is, the writable open) to Finish (the open closed, an image file cut to
// the new size, the result reported).
struct Resizing {
  txn::ImageLock lock;
  bool regular = false;
  uint64_t file_size = 0;
  Opened o;

  Status Begin(const std::string& path) {
    UB_RETURN_IF_ERROR(lock.Take(path));
    UB_ASSIGN_OR_RETURN(regular, IsRegular(path, &file_size));
    UB_ASSIGN_OR_RETURN(o, txn::OpenImageWritable(path));
    return Status::Ok();
  }
  Status Finish(const std::string& path, uint64_t want, ResizeResult r, ResizeResult* result) {
    o.txn.reset();
    o.vol.reset();
    if (regular && want < file_size) UB_RETURN_IF_ERROR(SetFileSize(path, want));
    r.new_bytes = want;
    *result = r;
    return Status::Ok();
  }
};

// The size `target` asks for, from the current `old_bytes` and the image
// file's or device's `file_size`; not for kMin, which the caller measures.
Result<uint64_t> WantedSize(const ResizeTarget& target, uint64_t old_bytes, uint64_t file_size, const char* what) {
  switch (target.kind) {
    case ResizeTarget::kBytes: return target.bytes;
    case ResizeTarget::kGrowBy:
      if (target.bytes > UINT64_MAX - old_bytes) return Status::Invalid("the new size would overflow");
      return old_bytes + target.bytes;
    case ResizeTarget::kShrinkBy:
      if (target.bytes >= old_bytes) {
        return Status::Invalid("cannot shrink a " + std::to_string(old_bytes) + "-byte " + what + " by " +
                               std::to_string(target.bytes) + " bytes");
      }
      return old_bytes - target.bytes;
    case ResizeTarget::kMax: return file_size;
    case ResizeTarget::kMin: break;
  }
  return Status::Invalid("no size for `min` here");
}

// Moves the copy that ends last down as far as it goes, as long as one
// does: the smallest end the current chunks can have. Commits each move.
Status CompactDown(txn::TxnManager* txn, ResizeResult* r, txn::CopyStats* copied, uint64_t only_devid = 0) {
  txn::DeviceLayout layout(txn);
  for (int guard = 0; guard < 100000; ++guard) {
    auto stripes = layout.Stripes();
    if (only_devid != 0) std::erase_if(stripes, [&](const auto& s) { return s.devid != only_devid; });
    if (stripes.empty()) return Status::Ok();
    auto last = *std::max_element(stripes.begin(), stripes.end(), [](const auto& a, const auto& b) {
      return a.physical + a.length < b.physical + b.length;
    });
    const uint64_t to = layout.FindPlace(last, last.physical);
    if (to == 0) return Status::Ok();
    UB_RETURN_IF_ERROR(layout.MoveStripe(last.logical, last.index, to, copied));
    UB_RETURN_IF_ERROR(txn->Commit());
    ++r->stripes_moved;
  }
  return Status::Ok();
}

// resize and --shrink of a whole image: one device (ResizeDevice names one
// of several).
Status OneDevice(const Opened& o, bool shrink = false) {
  const uint64_t n = o.vol->super().num_devices.get();
  if (n == 1) return Status::Ok();
  return Status::Invalid("the filesystem has " + std::to_string(n) + " devices: " +
                         (shrink ? std::string("shrinking to fit works on images of one device")
                                 : std::string("name them all (IMG1,IMG2,...) and the one to resize as DEVID:SIZE")));
}

}  // namespace

Status ParseResizeTarget(std::string_view text, ResizeTarget* out) {
  *out = ResizeTarget{};
  if (text == "max") {
    out->kind = ResizeTarget::kMax;
    return Status::Ok();
  }
  if (text == "min") {
    out->kind = ResizeTarget::kMin;
    return Status::Ok();
  }
  std::string_view s = text;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    out->kind = s[0] == '+' ? ResizeTarget::kGrowBy : ResizeTarget::kShrinkBy;
    s.remove_prefix(1);
  }
  if (s.empty() || s[0] < '0' || s[0] > '9') {
    return Status::Invalid("'" + std::string(text) + "' is not a size, +N, -N, max or min");
  }
  Status st = ParseByteSize(s, &out->bytes);
  if (st.ok() || s.size() == text.size()) return st;
  // The message quotes what was given, sign and all.
  std::string m = st.message();
  const std::string part = "'" + std::string(s) + "'";
  if (const size_t at = m.find(part); at != std::string::npos) m.replace(at, part.size(), "'" + std::string(text) + "'");
  return Status::Error(st.code(), m);
}

Status ParseByteSize(std::string_view text, uint64_t* bytes) {
  size_t i = 0;
  uint64_t v = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    const uint64_t d = static_cast<uint64_t>(text[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return Status::Error(ERANGE, "size '" + std::string(text) + "' is too large");
    v = v * 10 + d;
  }
  if (i == 0) return Status::Invalid("'" + std::string(text) + "' is not a size");
  std::string_view unit = text.substr(i);
  int shift = 0;
  if (!unit.empty()) {
    switch (unit[0]) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      case 't': case 'T': shift = 40; break;
      case 'p': case 'P': shift = 50; break;
      case 'e': case 'E': shift = 60; break;
      default: return Status::Invalid("'" + std::string(text) + "': unknown unit (K, M, G, T, P, E)");
    }
    unit.remove_prefix(1);
    if (unit != "" && unit != "B" && unit != "b" && unit != "iB" && unit != "ib") {
      return Status::Invalid("'" + std::string(text) + "': unknown unit");
    }
  }
  if (shift > 0 && v > (UINT64_MAX >> shift)) return Status::Error(ERANGE, "size '" + std::string(text) + "' is too large");
  *bytes = v << shift;
  return Status::Ok();
}

Status ResizeImage(const std::string& path, const ResizeTarget& target, ResizeResult* result) {
  ResizeResult r;
  txn::CopyStats copied;
  Resizing resizing;
  UB_RETURN_IF_ERROR(resizing.Begin(path));
  Opened& o = resizing.o;
  const bool regular = resizing.regular;
  const uint64_t file_size = resizing.file_size;
  const uint32_t ss = o.vol->sectorsize();
  UB_RETURN_IF_ERROR(OneDevice(o));
  r.old_bytes = o.vol->super().total_bytes.get();
  txn::DeviceLayout layout(o.txn.get());

  uint64_t want = 0;
  if (target.kind == ResizeTarget::kMin) {
    UB_RETURN_IF_ERROR(CompactDown(o.txn.get(), &r, &copied));
    want = layout.DeviceExtentEnd();
  } else {
    UB_ASSIGN_OR_RETURN(want, WantedSize(target, r.old_bytes, file_size, "filesystem"));
  }
  want = want / ss * ss;
  if (!regular && want > file_size) {
    return Status::Invalid("the device " + path + " has " + std::to_string(file_size) + " bytes; cannot grow to " +
                           std::to_string(want));
  }

  if (want > r.old_bytes || (want > o.vol->devices().Get(o.vol->super().dev_item.devid.get())->Size())) {
    // Growing: the file first, so that the device (and the superblock
    // copies that now fit) is there when the commit writes.
    if (regular && file_size < want) {
      o.txn.reset();
      o.vol.reset();
      UB_RETURN_IF_ERROR(SetFileSize(path, want));
      UB_ASSIGN_OR_RETURN(o, txn::OpenImageWritable(path));
    }
    txn::DeviceLayout grow(o.txn.get());
    UB_RETURN_IF_ERROR(grow.SetDeviceSize(want));
    UB_RETURN_IF_ERROR(o.txn->Commit());
    r.new_bytes = want;
    *result = r;
    return Status::Ok();
  }

  // Shrinking: every copy that reaches past the new end moves below it,
  // largest first (they are the hardest to place).
  for (;;) {
    auto stripes = layout.Stripes();
    std::vector<txn::DeviceLayout::Stripe> past;
    for (const auto& s : stripes) {
      if (s.physical + s.length > want) past.push_back(s);
    }
    if (past.empty()) break;
    std::sort(past.begin(), past.end(), [](const auto& a, const auto& b) { return a.length > b.length; });
    const auto& s = past.front();
    const uint64_t to = layout.FindPlace(s, want);
    if (to == 0) {
      uint64_t largest = 0;
      for (auto [hs, hl] : o.txn->chunk_alloc().FreeDeviceRanges()) {
        if (hs < want) largest = std::max(largest, std::min(hs + hl, want) - hs);
      }
      return Status::Invalid("cannot shrink to " + std::to_string(want) + " bytes (" + Mib(want) + "): the " +
                             KindText(s.type) + " chunk at logical " + std::to_string(s.logical) + " (copy " +
                             std::to_string(s.index) + ", " + Mib(s.length) + " at device offset " +
                             std::to_string(s.physical) + ") does not fit in the free device space below it " +
                             "(largest free range " + Mib(largest) + "); `resize IMAGE min` gives the smallest size");
    }
    UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, to, &copied));
    UB_RETURN_IF_ERROR(o.txn->Commit());
    ++r.stripes_moved;
  }
  if (want < r.old_bytes || target.kind == ResizeTarget::kMin) {
    UB_RETURN_IF_ERROR(layout.SetDeviceSize(want));
    UB_RETURN_IF_ERROR(o.txn->Commit());
  }
  txn::Report(copied, &r);
  return resizing.Finish(path, want, r, result);
}

Status ShrinkImageToFit(const std::string& path, ResizeResult* result) {
  ResizeResult r;
  txn::CopyStats copied;
  Resizing resizing;
  UB_RETURN_IF_ERROR(resizing.Begin(path));
  Opened& o = resizing.o;
  UB_RETURN_IF_ERROR(OneDevice(o, true));
  r.old_bytes = o.vol->super().total_bytes.get();
  txn::DeviceLayout layout(o.txn.get());
  UB_RETURN_IF_ERROR(layout.TrimChunks(&r.bytes_trimmed));
  UB_RETURN_IF_ERROR(o.txn->Commit());
  UB_RETURN_IF_ERROR(CompactDown(o.txn.get(), &r, &copied));
  const uint64_t want = layout.DeviceExtentEnd();
  UB_RETURN_IF_ERROR(layout.SetDeviceSize(want));
  UB_RETURN_IF_ERROR(o.txn->Commit());
  txn::Report(copied, &r);
  return resizing.Finish(path, want, r, result);
}

Status ShrinkImage(const std::string& path, ShrinkResult* result) {
  *result = ShrinkResult{};
  RelocateOptions pack;
  // Groups not full: their free space goes.
  pack.data = pack.metadata = UsageFilter{true, 0, 100};
  {
    Resizing clear;
    UB_RETURN_IF_ERROR(clear.Begin(path));
    UB_RETURN_IF_ERROR(OneDevice(clear.o, true));
    UB_RETURN_IF_ERROR(txn::RefuseKernelRelocation(*clear.o.vol));
    txn::TxnManager* txn = clear.o.txn.get();
    txn::DeviceLayout layout(txn);
    result->resize.old_bytes = clear.o.vol->super().total_bytes.get();
    uint64_t used = 0;
    for (uint64_t kind : {format::kBlockGroupData, format::kBlockGroupMetadata, format::kBlockGroupSystem}) {
      used += txn->space().TotalsFor(kind).used_bytes;
    }
    uint64_t trimmed = 0;
    UB_RETURN_IF_ERROR(layout.TrimChunks(&trimmed));
    UB_RETURN_IF_ERROR(txn->Commit());
    result->resize.bytes_trimmed += trimmed;
    uint64_t free = 0;
    for (auto [start, len] : txn->chunk_alloc().FreeDeviceRanges()) free += len;
    // Moving chunks down leaves holes where none fits (a full chunk cannot
    // cover the superblock copy at 64 MiB; one larger than every hole stays
    // where it is). Packed into chunks made from the bottom of the device,
    // everything lies end to end, and a new chunk over that superblock copy
    // has it kept out of its allocations from the start. So where the
    // device has room for a second copy of what it holds, and that is under
    // 2 GiB (above, such holes are a few percent), every chunk first goes
    // to the top of the device and every group is packed, full ones too:
    // what the filesystem holds is copied twice.
    if (used < (2ull << 30) && free >= used + (32ull << 20)) {
      txn::CopyStats copied;
      auto stripes = layout.Stripes();
      std::sort(stripes.begin(), stripes.end(), [](const auto& a, const auto& b) { return a.physical > b.physical; });
      for (const auto& s : stripes) {
        const uint64_t to = layout.FindPlaceAbove(s);
        if (to == 0) continue;
        UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, to, &copied));
        UB_RETURN_IF_ERROR(txn->Commit());
        ++result->resize.stripes_moved;
      }
      txn::Report(copied, &result->resize);
      pack.data.max_percent = pack.metadata.max_percent = 101;
    }
  }
  if (Status st = RelocateGroups({path}, pack, &result->packed); !st.ok()) {
    // Refused before anything moved, or out of room part way (what moved
    // is committed): the chunks are cut as they are. Anything else (an
    // I/O error, a damaged tree) stops here.
    if (st.code() != ENOSPC && st.code() != EINVAL) return st;
    result->notes.push_back("block groups not packed: " + st.message());
  }
  ResizeResult fit;
  UB_RETURN_IF_ERROR(ShrinkImageToFit(path, &fit));
  ResizeResult& r = result->resize;
  r.new_bytes = fit.new_bytes;
  r.stripes_moved += fit.stripes_moved;
  r.bytes_copied += fit.bytes_copied;
  r.bytes_trimmed += fit.bytes_trimmed;
  r.copy_check.repaired += fit.copy_check.repaired;
  r.copy_check.unrecoverable += fit.copy_check.unrecoverable;
  r.copy_check.errors.insert(r.copy_check.errors.end(), fit.copy_check.errors.begin(), fit.copy_check.errors.end());
  return Status::Ok();
}

Status ResizeDevice(const std::vector<std::string>& devices, uint64_t devid, const ResizeTarget& target,
                    const DeviceChangeOptions& options, ResizeResult* result) {
  ResizeResult r;
  txn::CopyStats copied;
  UB_ASSIGN_OR_RETURN(txn::OpenedSet set, txn::OpenSet(devices, options));
  auto name = set.names.find(devid);
  if (name == set.names.end()) {
    return Status::Invalid("no device " + std::to_string(devid) + " in this filesystem (its devices: " +
                           set.Listing() + ")");
  }
  const std::string path = name->second;
  uint64_t file_size = 0;
  UB_ASSIGN_OR_RETURN(const bool regular, IsRegular(path, &file_size));
  const format::DevItem* item = set.o.vol->mutable_dev_item(devid);
  if (item == nullptr) return Status::Corrupt("no DEV_ITEM for device " + std::to_string(devid));
  r.old_bytes = item->total_bytes.get();
  const uint32_t ss = set.o.vol->sectorsize();
  uint64_t want = 0;
  if (target.kind == ResizeTarget::kMin) {
    UB_RETURN_IF_ERROR(CompactDown(set.o.txn.get(), &r, &copied, devid));
    want = txn::DeviceLayout(set.o.txn.get()).DeviceExtentEnd(devid);
  } else {
    UB_ASSIGN_OR_RETURN(want, WantedSize(target, r.old_bytes, file_size, "device"));
  }
  want = want / ss * ss;
  if (want < txn::kMinDeviceBytes) {
    return Status::Invalid("a device needs at least " + std::to_string(txn::kMinDeviceBytes) + " bytes (16 MiB)");
  }
  if (want > file_size) {
    if (!regular) {
      return Status::Invalid("the device " + path + " has " + std::to_string(file_size) + " bytes; cannot grow to " +
                             std::to_string(want));
    }
    // The file first, opened again, so that the device is there when the
    // commit writes.
    txn::Close(&set);
    UB_RETURN_IF_ERROR(SetFileSize(path, want));
    UB_ASSIGN_OR_RETURN(set, txn::OpenSet(devices, options));
  }
  txn::DeviceLayout layout(set.o.txn.get());
  // Shrinking: every stripe of the device past the new end moves, largest
  // first, below it on the same device, else to another device.
  for (int guard = 0; guard < 100000; ++guard) {
    std::vector<txn::DeviceLayout::Stripe> past;
    for (const auto& s : layout.Stripes()) {
      if (s.devid == devid && s.physical + s.length > want) past.push_back(s);
    }
    if (past.empty()) break;
    std::sort(past.begin(), past.end(), [](const auto& a, const auto& b) { return a.length > b.length; });
    const auto& s = past.front();
    if (const uint64_t to = layout.FindPlace(s, want); to != 0) {
      UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, to, &copied));
    } else {
      uint64_t other = 0, to_other = 0;
      if (Status st = layout.FindNewHome(s, devid, &other, &to_other); !st.ok()) {
        return Status::Invalid("cannot shrink device " + std::to_string(devid) + " to " + std::to_string(want) +
                               " bytes (" + Mib(want) + "): the " + KindText(s.type) + " chunk at logical " +
                               std::to_string(s.logical) + " fits neither below that on the device nor elsewhere (" +
                               st.message() + ")");
      }
      UB_RETURN_IF_ERROR(layout.MoveStripe(s.logical, s.index, other, to_other, &copied));
    }
    UB_RETURN_IF_ERROR(set.o.txn->Commit());
    ++r.stripes_moved;
  }
  UB_RETURN_IF_ERROR(layout.SetDeviceSize(devid, want));
  UB_RETURN_IF_ERROR(set.o.txn->Commit());
  txn::Close(&set);
  if (regular && want < file_size) UB_RETURN_IF_ERROR(SetFileSize(path, want));
  r.new_bytes = want;
  txn::Report(copied, &r);
  *result = r;
  return Status::Ok();
}

}  // namespace ubtrfs
