#include "check/scrub.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>

#include <fmt/core.h>

#include "format/checksum.h"
#include "format/key.h"
#include "format/ondisk.h"
#include "format/superblock.h"
#include "txn/devices.h"
#include "txn/super_copies.h"

namespace ubtrfs::check {

using namespace ubtrfs::format;

namespace {

class Scrubber {
 public:
  Scrubber(txn::Volume& vol, const ScrubOptions& o, ScrubResult* r) : vol_(vol), io_(vol.chunk_io()), o_(o), r_(r) {}

  Status Run() {
    r_->missing_devices = vol_.missing_devices();
    if (o_.superblocks) UB_RETURN_IF_ERROR(Superblocks());
    if (o_.metadata) UB_RETURN_IF_ERROR(TreeBlocks());
    if (o_.data) UB_RETURN_IF_ERROR(Data());
    // Parity last: it is judged against data that is verified (and
    // repaired) by now.
    if (o_.data && o_.metadata) UB_RETURN_IF_ERROR(ParityRows());
    if (!o_.readonly) UB_RETURN_IF_ERROR(vol_.devices().Flush());
    return Status::Ok();
  }

 private:
  void Error(std::string line) {
    if (r_->errors.size() < o_.max_errors || o_.max_errors == 0) {
      r_->errors.push_back(std::move(line));
    } else {
      ++r_->error_lines_dropped;
    }
  }

  bool Parity(const alloc::ChunkInfo& c) const { return c.parity_stripes() > 0; }

  // Whether mirror m of [logical, +len) lies wholly on present devices.
  bool Present(uint64_t logical, uint64_t len, int m) const {
    auto copies = vol_.chunks().Map(logical, len);
    if (!copies.ok() || static_cast<size_t>(m) >= copies->size()) return false;
    for (const auto& p : (*copies)[m]) {
      if (!vol_.devices().Has(p.devid)) return false;
    }
    return true;
  }

  // The copies a scrub verifies: every mirror of a mirrored chunk, the
  // stored data of a RAID5/6 one.
  int Copies(const alloc::ChunkInfo& c) const { return Parity(c) ? 1 : static_cast<int>(c.mirrors()); }

  Status Rewrite(const alloc::ChunkInfo& c, uint64_t logical, std::span<const uint8_t> good, int m) {
    for (const alloc::StripeLoc& st : c.stripes) {
      if (vol_.IsSeedDevice(st.devid)) {
        return Status::Error(EROFS, "logical " + std::to_string(logical) + " lies on seed device " +
                                        std::to_string(st.devid) + ", which is never written");
      }
    }
    if (!Parity(c)) return io_.WriteMirror(logical, good, m);
    // The rebuilt data agrees with the row's parity: writing it back where
    // it belongs makes the row whole again without touching P or Q.
    UB_ASSIGN_OR_RETURN(auto copies, vol_.chunks().Map(logical, good.size()));
    for (const auto& p : copies.at(0)) {
      UB_RETURN_IF_ERROR(vol_.devices().WriteAt(p.devid, p.physical, good.subspan(p.buf_offset, p.length)));
    }
    return Status::Ok();
  }

  // Every superblock copy of every present device: valid, this
  // filesystem's, this device's, and of the generation the volume uses.
  // Bad ones are rewritten as a commit writes them (all copies).
  Status Superblocks() {
    bool bad = false;
    for (const txn::SuperCopyState& c : txn::CheckSuperCopies(vol_)) {
      ++r_->super_copies;
      if (c.problem.empty()) continue;
      ++r_->super_errors;
      bad = true;
      Error("device " + std::to_string(c.devid) + " superblock copy " + std::to_string(c.mirror) + " at " +
            std::to_string(c.bytenr) + ": " + c.problem);
    }
    if (!bad) return Status::Ok();
    if (o_.readonly) {
      ++r_->unrepaired;
      return Status::Ok();
    }
    UB_RETURN_IF_ERROR(vol_.WriteSuperblocks().WithContext("scrub: rewriting the superblocks"));
    ++r_->corrected;
    return Status::Ok();
  }

  Status TreeBlocks() {
    auto extent_root = vol_.FindRoot(kExtentTreeObjectid);
    if (!extent_root.ok()) return extent_root.status().WithContext("scrub: extent tree");
    const uint32_t nodesize = vol_.nodesize();
    tree::Cursor cur(vol_.reader(), extent_root->ref);
    UB_RETURN_IF_ERROR(cur.SeekFirst().WithContext("scrub: extent tree"));
    for (; cur.Valid(); ) {
      const Key k = cur.key();
      int level = -1;
      if (k.type == kMetadataItemKey) {
        level = static_cast<int>(std::min<uint64_t>(k.offset, kMaxLevel));
      } else if (k.type == kExtentItemKey && cur.data().size() >= sizeof(ExtentItem) + sizeof(TreeBlockInfo)) {
        const auto* ei = reinterpret_cast<const ExtentItem*>(cur.data().data());
        if (ei->flags.get() & kExtentFlagTreeBlock) {
          level = reinterpret_cast<const TreeBlockInfo*>(cur.data().data() + sizeof(ExtentItem))->level;
        }
      }
      if (level >= 0) UB_RETURN_IF_ERROR(TreeBlock(k.objectid, level, nodesize));
      UB_RETURN_IF_ERROR(cur.Next().WithContext("scrub: extent tree"));
    }
    return Status::Ok();
  }

  Status TreeBlock(uint64_t bytenr, int level, uint32_t nodesize) {
    const alloc::ChunkInfo* c = vol_.chunks().Find(bytenr);
    const std::string name = "tree block " + std::to_string(bytenr);
    if (c == nullptr) {
      ++r_->uncorrectable;
      Error(name + ": not in any chunk");
      return Status::Ok();
    }
    ++r_->tree_blocks;
    const tree::BlockCheck check{bytenr, level, 0, {}};
    const int copies = Copies(*c);
    std::vector<int> bad;
    std::vector<std::string> lines;
    tree::BlockRef good;
    for (int m = 0; m < copies; ++m) {
      if (!Present(bytenr, nodesize, m)) continue;
      r_->tree_bytes += nodesize;
      auto b = vol_.reader()->ReadMirror(check, m);
      if (b.ok()) {
        if (!good) good = *b;
        continue;
      }
      (b.status().code() == EIO ? r_->read_errors : r_->verify_errors)++;
      lines.push_back(name + " (" + alloc::ProfileName(c->type) + " copy " + std::to_string(m + 1) +
                      "): " + b.status().message());
      bad.push_back(m);
    }
    if (bad.empty()) return Status::Ok();
    // RAID5/6: the stored copy was bad; a rebuild from parity is the good one.
    for (int m = copies; !good && m < io_.NumMirrors(bytenr); ++m) {
      if (auto b = vol_.reader()->ReadMirror(check, m); b.ok()) good = *b;
    }
    return Repair(*c, bytenr, good ? good->bytes() : std::span<const uint8_t>(), bad, name, std::move(lines));
  }

  Status Repair(const alloc::ChunkInfo& c, uint64_t logical, std::span<const uint8_t> good, const std::vector<int>& bad,
                const std::string& name, std::vector<std::string> lines) {
    if (!good.empty() || !o_.only_repairable) {
      for (auto& l : lines) Error(std::move(l));
    }
    if (good.empty()) {
      ++r_->uncorrectable;
      Error(name + ": no good copy");
      LeftBad(c, logical);
      return Status::Ok();
    }
    for (int m : bad) {
      if (o_.readonly) {
        ++r_->unrepaired;
        LeftBad(c, logical);
        continue;
      }
      Status st = Rewrite(c, logical, good, m);
      if (!st.ok()) {
        ++r_->uncorrectable;
        Error(name + ": rewriting copy " + std::to_string(m + 1) + ": " + st.message());
        LeftBad(c, logical);
        continue;
      }
      ++r_->corrected;
    }
    return Status::Ok();
  }

  // RAID5/6 rows: (chunk, row) of a logical address.
  static std::pair<uint64_t, uint64_t> RowOf(const alloc::ChunkInfo& c, uint64_t logical) {
    return {c.logical, (logical - c.logical) / (c.stripe_len * c.data_stripes())};
  }
  // A row whose data is still bad: its parity is not judged (it would be
  // "repaired" to match the bad data).
  void LeftBad(const alloc::ChunkInfo& c, uint64_t logical) {
    if (Parity(c)) bad_rows_.insert(RowOf(c, logical));
  }

  // The parity of every RAID5/6 row that holds an extent (rows with none,
  // such as those around a superblock copy, hold no data the kernel keeps
  // parity for), as the kernel's scrub checks it.
  Status ParityRows() {
    auto extent_root = vol_.FindRoot(kExtentTreeObjectid);
    if (!extent_root.ok()) return extent_root.status().WithContext("scrub: extent tree");
    bool any = false;
    for (const auto& [logical, c] : vol_.chunks().chunks()) any = any || Parity(c);
    if (!any) return Status::Ok();
    tree::Cursor cur(vol_.reader(), extent_root->ref);
    UB_RETURN_IF_ERROR(cur.SeekFirst().WithContext("scrub: extent tree"));
    std::pair<uint64_t, uint64_t> last{UINT64_MAX, 0};
    for (; cur.Valid();) {
      const Key k = cur.key();
      uint64_t len = 0;
      if (k.type == kExtentItemKey) len = k.offset;
      if (k.type == kMetadataItemKey) len = vol_.nodesize();
      const alloc::ChunkInfo* c = len ? vol_.chunks().Find(k.objectid) : nullptr;
      if (c != nullptr && Parity(*c) && k.objectid + len <= c->logical + c->length) {
        const auto first = RowOf(*c, k.objectid), end = RowOf(*c, k.objectid + len - 1);
        for (uint64_t row = first.second; row <= end.second; ++row) {
          const std::pair<uint64_t, uint64_t> at{c->logical, row};
          if (last.first == at.first && row <= last.second) continue;
          last = at;
          UB_RETURN_IF_ERROR(ParityRow(*c, row));
        }
      }
      UB_RETURN_IF_ERROR(cur.Next().WithContext("scrub: extent tree"));
    }
    return Status::Ok();
  }

  Status ParityRow(const alloc::ChunkInfo& c, uint64_t row) {
    if (bad_rows_.count({c.logical, row})) return Status::Ok();
    const std::string name = alloc::ProfileName(c.type) + " parity of chunk " + std::to_string(c.logical) + " row " +
                             std::to_string(row);
    auto r = io_.CheckRowParity(c, row, !o_.readonly);
    if (!r.ok()) {
      ++r_->read_errors;
      Error(name + ": " + r.status().message());
      return Status::Ok();
    }
    if (!r->complete) return Status::Ok();  // a device is missing
    ++r_->parity_rows;
    for (bool bad : {r->p_bad, r->q_bad}) {
      if (!bad) continue;
      ++r_->parity_errors;
      ++(o_.readonly ? r_->unrepaired : r_->corrected);
    }
    if (r->p_bad) Error(name + ": P does not match the data" + (o_.readonly ? "" : " (rewritten)"));
    if (r->q_bad) Error(name + ": Q does not match the data" + (o_.readonly ? "" : " (rewritten)"));
    return Status::Ok();
  }

  Status Data() {
    auto csum_root = vol_.FindRoot(kCsumTreeObjectid);
    if (!csum_root.ok()) return csum_root.status().code() == ENOENT ? Status::Ok() : csum_root.status();
    const size_t csize = CsumSize(vol_.csum_type());
    const uint32_t ss = vol_.sectorsize();
    tree::Cursor cur(vol_.reader(), csum_root->ref);
    UB_RETURN_IF_ERROR(cur.Seek(Key{kExtentCsumObjectid, kExtentCsumKey, 0}).WithContext("scrub: csum tree"));
    for (; cur.Valid(); ) {
      const Key k = cur.key();
      if (k.objectid != kExtentCsumObjectid || k.type != kExtentCsumKey) break;
      const auto d = cur.data();
      const uint64_t n = d.size() / csize;
      // Batches that stay inside one chunk.
      for (uint64_t i = 0; i < n;) {
        const uint64_t pos = k.offset + i * ss;
        const alloc::ChunkInfo* c = vol_.chunks().Find(pos);
        if (c == nullptr) {
          ++r_->uncorrectable;
          Error("csum item " + KeyToString(k) + ": logical " + std::to_string(pos) + " is not in any chunk");
          break;
        }
        const uint64_t cnt = std::min<uint64_t>({256, n - i, (c->logical + c->length - pos) / ss});
        if (cnt == 0) break;
        UB_RETURN_IF_ERROR(DataRange(*c, pos, cnt, d.subspan(i * csize, cnt * csize)));
        i += cnt;
      }
      UB_RETURN_IF_ERROR(cur.Next().WithContext("scrub: csum tree"));
    }
    return Status::Ok();
  }

  Status DataRange(const alloc::ChunkInfo& c, uint64_t pos, uint64_t cnt, std::span<const uint8_t> csums) {
    const uint32_t ss = vol_.sectorsize();
    const size_t csize = CsumSize(vol_.csum_type());
    const uint16_t type = vol_.csum_type();
    const int copies = Copies(c);
    std::vector<std::vector<uint8_t>> bufs(copies);
    std::vector<bool> readable(copies, false), present(copies, false);
    for (int m = 0; m < copies; ++m) {
      if (!Present(pos, cnt * ss, m)) continue;
      present[m] = true;
      bufs[m].resize(cnt * ss);
      r_->data_bytes += cnt * ss;
      Status st = io_.Read(pos, bufs[m], m);
      if (st.ok()) {
        readable[m] = true;
      } else {
        ++r_->read_errors;
        if (!o_.only_repairable) {
          Error("data at logical " + std::to_string(pos) + " (+" + std::to_string(cnt * ss) + ", " +
                alloc::ProfileName(c.type) + " copy " + std::to_string(m + 1) + "): " + st.message());
        }
      }
    }
    std::vector<uint8_t> rebuilt(ss);
    for (uint64_t j = 0; j < cnt; ++j) {
      const uint64_t at = pos + j * ss;
      const uint8_t* want = csums.data() + j * csize;
      std::vector<int> bad;
      std::vector<std::string> lines;
      int good = -1;
      for (int m = 0; m < copies; ++m) {
        if (!present[m]) continue;
        if (!readable[m]) {
          bad.push_back(m);
          continue;
        }
        const std::span<const uint8_t> sector(bufs[m].data() + j * ss, ss);
        if (VerifyCsum(type, sector, want)) {
          if (good < 0) good = m;
          continue;
        }
        ++r_->csum_errors;
        lines.push_back("data checksum mismatch at logical " + std::to_string(at) + " (" +
                        alloc::ProfileName(c.type) + " copy " + std::to_string(m + 1) + ")");
        bad.push_back(m);
      }
      if (bad.empty()) continue;
      std::span<const uint8_t> good_bytes;
      if (good >= 0) {
        good_bytes = std::span<const uint8_t>(bufs[good].data() + j * ss, ss);
      } else {
        for (int m = copies; m < io_.NumMirrors(at); ++m) {
          if (io_.Read(at, rebuilt, m).ok() && VerifyCsum(type, rebuilt, want)) {
            good_bytes = rebuilt;
            break;
          }
        }
      }
      UB_RETURN_IF_ERROR(Repair(c, at, good_bytes, bad, "data at logical " + std::to_string(at), std::move(lines)));
    }
    return Status::Ok();
  }

  txn::Volume& vol_;
  alloc::ChunkIo& io_;
  const ScrubOptions& o_;
  ScrubResult* r_;
  std::set<std::pair<uint64_t, uint64_t>> bad_rows_;  // RAID5/6 (chunk, row) with data left bad
};

std::string Json(std::string_view s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      out += fmt::format("\\u{:04x}", ch);
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

std::string Bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{}B", b) : fmt::format("{:.2f}{}", v, units[u]);
}

}  // namespace

Result<ScrubResult> ScrubVolume(txn::Volume& vol, const ScrubOptions& options) {
  ScrubResult r;
  const auto t0 = std::chrono::steady_clock::now();
  UB_RETURN_IF_ERROR(Scrubber(vol, options, &r).Run());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ubtrfs::check

namespace ubtrfs {

using check::Bytes;
using check::Json;

Result<ScrubResult> ScrubImage(const std::string& path, const ScrubOptions& options) {
  UB_ASSIGN_OR_RETURN(auto devs, txn::OpenDevices(txn::DeviceSpec::Of(path, options.offset, options.partition,
                                                                     options.scan_dirs, !options.readonly)));
  // The volume itself stays read-only (no transaction): repairs go straight
  // to the devices, which also lets RAID5/6 data be put back in place.
  txn::VolumeOptions vo;
  vo.verify_data_csums = false;
  vo.node_cache_bytes = 16ull << 20;
  auto vol = txn::Volume::Open(std::move(devs), vo);
  if (!vol.ok()) return vol.status().WithContext(path);
  auto r = check::ScrubVolume(**vol, options);
  if (!r.ok()) return r.status().WithContext(path);
  r->warnings = (*vol)->warnings();
  return r;
}

std::string ScrubSummary(const ScrubResult& r) {
  std::string out;
  const uint64_t total = r.tree_bytes + r.data_bytes;
  const unsigned secs = static_cast<unsigned>(r.seconds);
  out += fmt::format("Status:           finished\n");
  out += fmt::format("Duration:         {}:{:02}:{:02}\n", secs / 3600, secs / 60 % 60, secs % 60);
  out += fmt::format("Total to scrub:   {}\n", Bytes(total));
  out += fmt::format("Rate:             {}/s\n", Bytes(r.seconds > 0 ? static_cast<uint64_t>(total / r.seconds) : total));
  if (!r.missing_devices.empty()) {
    std::string list;
    for (uint64_t d : r.missing_devices) list += (list.empty() ? "" : ", ") + std::to_string(d);
    out += fmt::format("Missing devices:  {} (their copies were not scrubbed)\n", list);
  }
  if (r.errors_found() == 0 && r.uncorrectable == 0) {
    out += "Error summary:    no errors found\n";
    return out;
  }
  std::string kinds;
  if (r.read_errors) kinds += fmt::format(" read={}", r.read_errors);
  if (r.super_errors) kinds += fmt::format(" super={}", r.super_errors);
  if (r.verify_errors) kinds += fmt::format(" verify={}", r.verify_errors);
  if (r.csum_errors) kinds += fmt::format(" csum={}", r.csum_errors);
  if (r.parity_errors) kinds += fmt::format(" parity={}", r.parity_errors);
  out += fmt::format("Error summary:   {}\n", kinds);
  out += fmt::format("  Corrected:      {}\n", r.corrected);
  out += fmt::format("  Uncorrectable:  {}\n", r.uncorrectable);
  out += fmt::format("  Unverified:     0\n");
  if (r.unrepaired) out += fmt::format("  Not repaired:   {} (--readonly)\n", r.unrepaired);
  return out;
}

std::string ScrubJson(const ScrubResult& r) {
  std::string errs;
  for (const auto& e : r.errors) errs += (errs.empty() ? "" : ", ") + Json(e);
  std::string missing;
  for (uint64_t d : r.missing_devices) missing += (missing.empty() ? "" : ", ") + std::to_string(d);
  return fmt::format(
      "{{\"tree_blocks\": {}, \"tree_bytes_scrubbed\": {}, \"data_bytes_scrubbed\": {}, \"super_errors\": {}, "
      "\"read_errors\": {}, "
      "\"verify_errors\": {}, \"csum_errors\": {}, \"parity_errors\": {}, \"parity_rows\": {}, "
      "\"corrected_errors\": {}, \"uncorrectable_errors\": {}, "
      "\"unrepaired_errors\": {}, \"missing_devices\": [{}], \"duration_seconds\": {:.3f}, \"errors\": [{}]}}",
      r.tree_blocks, r.tree_bytes, r.data_bytes, r.super_errors, r.read_errors, r.verify_errors, r.csum_errors,
      r.parity_errors, r.parity_rows, r.corrected,
      r.uncorrectable, r.unrepaired, missing, r.seconds, errs);
}

}  // namespace ubtrfs
