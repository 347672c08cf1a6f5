#include "io/device_set.h"

namespace ubtrfs::io {

bool DeviceSet::Add(uint64_t devid, std::unique_ptr<BlockDevice> dev) {
  return devs_.emplace(devid, std::move(dev)).second;
}

BlockDevice* DeviceSet::Get(uint64_t devid) const {
  auto it = devs_.find(devid);
  return it == devs_.end() ? nullptr : it->second.get();
}

std::unique_ptr<BlockDevice> DeviceSet::Remove(uint64_t devid) {
  auto it = devs_.find(devid);
  if (it == devs_.end()) return nullptr;
  std::unique_ptr<BlockDevice> d = std::move(it->second);
  devs_.erase(it);
  return d;
}

std::vector<uint64_t> DeviceSet::Devids() const {
  std::vector<uint64_t> out;
  for (const auto& [id, d] : devs_) out.push_back(id);
  return out;
}

std::map<uint64_t, uint64_t> DeviceSet::Sizes() const {
  std::map<uint64_t, uint64_t> out;
  for (const auto& [id, d] : devs_) out[id] = d->Size();
  return out;
}

Status DeviceSet::Missing(uint64_t devid) const {
  return Status::IoError("device " + std::to_string(devid) + " is missing");
}

Status DeviceSet::ReadAt(uint64_t devid, uint64_t offset, std::span<uint8_t> buf) {
  BlockDevice* d = Get(devid);
  return d ? d->ReadAt(offset, buf) : Missing(devid);
}

Status DeviceSet::WriteAt(uint64_t devid, uint64_t offset, std::span<const uint8_t> buf) {
  BlockDevice* d = Get(devid);
  return d ? d->WriteAt(offset, buf) : Missing(devid);
}

Status DeviceSet::WriteGather(uint64_t devid, uint64_t offset, std::span<const std::span<const uint8_t>> pieces) {
  BlockDevice* d = Get(devid);
  return d ? d->WriteGather(offset, pieces) : Missing(devid);
}

Status DeviceSet::Flush() {
  Status first;
  for (auto& [id, d] : devs_) {
    Status st = d->Flush();
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

void DeviceSet::StartWriteback() {
  for (auto& [id, d] : devs_) d->StartWriteback();
}

std::vector<std::pair<uint64_t, std::unique_ptr<BlockDevice>>> DeviceSet::Release() {
  std::vector<std::pair<uint64_t, std::unique_ptr<BlockDevice>>> out;
  for (auto& [id, d] : devs_) out.emplace_back(id, std::move(d));
  devs_.clear();
  return out;
}

}  // namespace ubtrfs::io
