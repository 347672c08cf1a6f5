#include "txn/devices.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include "format/superblock.h"

namespace ubtrfs::txn {

using namespace ubtrfs::format;

Result<SuperChoice> ReadSuperblock(io::BlockDevice& dev, int only_mirror) {
  if (only_mirror >= kSuperMirrorMax) {
    return Status::Invalid("superblock copy " + std::to_string(only_mirror) + ": there are copies 0 to " +
                           std::to_string(kSuperMirrorMax - 1));
  }
  std::vector<std::string> problems;
  std::vector<uint8_t> buf(kSuperInfoSize);
  int best = -1;
  uint64_t best_gen = 0;
  SuperBlock best_sb{};
  for (int mirror = 0; mirror < kSuperMirrorMax; ++mirror) {
    if (only_mirror >= 0 && mirror != only_mirror) continue;
    const uint64_t off = SuperblockOffset(mirror);
    if (off + kSuperInfoSize > dev.Size()) {
      if (mirror == only_mirror) {  // asked for one the device is too small to have
        return Status::Invalid(dev.Name() + ": superblock copy " + std::to_string(mirror) + " at " +
                               std::to_string(off) + ": device is only " + std::to_string(dev.Size()) + " bytes");
      }
      if (mirror == 0) {
        problems.push_back("primary superblock at 65536: device is only " + std::to_string(dev.Size()) + " bytes");
      }
      break;
    }
    Status st = dev.ReadAt(off, buf);
    if (st.ok()) st = ValidateSuperblock(buf, off);
    if (!st.ok()) {
      problems.push_back((mirror == 0 ? "primary " : "copy " + std::to_string(mirror) + " ") + st.message());
      continue;
    }
    SuperBlock sb;
    std::memcpy(&sb, buf.data(), sizeof sb);
    if (mirror == 0 && only_mirror != kNewestValidSuper) {
      best = 0;
      best_sb = sb;
      break;  // a valid primary always wins, as in the kernel
    }
    if (best < 0 || sb.generation.get() > best_gen) {
      best = mirror;
      best_gen = sb.generation.get();
      best_sb = sb;
    }
  }
  if (best < 0) {
    // btrfs-image writes its dumps in a format of its own (this magic
    // first); only a restored dump is an image.
    constexpr uint64_t kMetadumpMagic = 0xbd5c25e27295668bULL;
    std::vector<uint8_t> head(sizeof(uint64_t));
    if (dev.Size() >= head.size() && dev.ReadAt(0, head).ok() && LoadLe<uint64_t>(head.data()) == kMetadumpMagic) {
      return Status::Unsupported(dev.Name() + ": a btrfs-image metadump, not an image (btrfs-image -r DUMP IMAGE restores it)");
    }
    std::string msg = dev.Name() + ": no valid btrfs superblock";
    for (const auto& p : problems) msg += "; " + p;
    // A checksum type we do not know is not damage: say unsupported.
    if (!problems.empty() && problems.front().find("unsupported: ") != std::string::npos) {
      return Status::Error(EOPNOTSUPP, msg);
    }
    return Status::Corrupt(msg);
  }
  SuperChoice out;
  out.sb = best_sb;
  out.mirror = best;
  if (best > 0 && only_mirror == -1) {
    out.warning = problems.front() + "; using superblock copy " + std::to_string(best) + " at offset " +
                  std::to_string(SuperblockOffset(best)) + " (generation " +
                  std::to_string(best_sb.generation.get()) + ")";
  }
  return out;
}

std::vector<std::string> SplitDeviceList(const std::string& spec) {
  struct stat st;
  if (spec.find(',') == std::string::npos || ::stat(spec.c_str(), &st) == 0) return {spec};
  std::vector<std::string> out;
  size_t from = 0;
  for (;;) {
    const size_t comma = spec.find(',', from);
    std::string part = spec.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    if (!part.empty()) out.push_back(std::move(part));
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

Result<std::vector<std::unique_ptr<io::BlockDevice>>> OpenDevices(const DeviceSpec& spec) {
  if (spec.paths.empty()) return Status::Invalid("no device named");
  std::vector<std::unique_ptr<io::BlockDevice>> out;
  std::set<std::string> named;
  for (const auto& p : spec.paths) {
    UB_ASSIGN_OR_RETURN(auto dev, io::OpenImage(p, io::OpenFlags{}, spec.where));
    // A seed stays open read-only under a writable sprout: nothing is ever
    // written to it, and it may well be a read-only file or device.
    if (spec.writable) {
      auto sb = ReadSuperblock(*dev);
      if (!sb.ok() || !(sb->sb.flags.get() & kSuperFlagSeeding)) {
        dev.reset();
        UB_ASSIGN_OR_RETURN(dev, io::OpenImage(p, io::OpenFlags{true}, spec.where));
      }
    }
    std::error_code ec;
    named.insert(std::filesystem::weakly_canonical(p, ec).string());
    out.push_back(std::move(dev));
  }
  if (spec.scan_dirs.empty()) return out;
  UB_ASSIGN_OR_RETURN(SuperChoice first, ReadSuperblock(*out.front()));
  std::set<uint64_t> devids;
  for (auto& d : out) {
    if (auto s = ReadSuperblock(*d); s.ok()) devids.insert(s->sb.dev_item.devid.get());
  }
  for (const auto& dir : spec.scan_dirs) {
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    if (ec) return Status::Error(ec.value(), "--scan " + dir + ": " + ec.message());
    std::vector<std::string> candidates;
    for (const auto& e : it) {
      std::error_code e2;
      if (!e.is_regular_file(e2) && !e.is_block_file(e2)) continue;
      candidates.push_back(e.path().string());
    }
    std::sort(candidates.begin(), candidates.end());
    for (const auto& c : candidates) {
      std::error_code e3;
      if (named.count(std::filesystem::weakly_canonical(c, e3).string())) continue;
      auto probe = io::OpenImage(c, io::OpenFlags{}, spec.where);
      if (!probe.ok()) continue;
      auto sb = ReadSuperblock(**probe);
      if (!sb.ok() || std::memcmp(sb->sb.fsid, first.sb.fsid, kFsidSize) != 0) continue;
      if (!devids.insert(sb->sb.dev_item.devid.get()).second) continue;
      UB_ASSIGN_OR_RETURN(auto dev, io::OpenImage(c, io::OpenFlags{spec.writable}, spec.where));
      named.insert(std::filesystem::weakly_canonical(c, e3).string());
      out.push_back(std::move(dev));
    }
  }
  return out;
}

}  // namespace ubtrfs::txn
