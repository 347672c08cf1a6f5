#include "check/uuid_tree.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "format/endian.h"
#include "format/ondisk.h"
#include "format/superblock.h"

namespace ubtrfs::check {

using namespace format;

namespace {

bool Zero(const uint8_t* u) {
  return std::all_of(u, u + kUuidSize, [](uint8_t b) { return b == 0; });
}

std::string Describe(uint8_t type, const uint8_t* uuid, uint64_t id) {
  return std::string(type == kUuidKeySubvol ? "uuid " : "received uuid ") + UuidToString(uuid) + " of subvolume " +
         std::to_string(id);
}

}  // namespace

void UuidTreeCheck::Subvolume(uint64_t id, std::span<const uint8_t> root_item) {
  if (root_item.size() < sizeof(RootItem)) return;  // a v1 item has no uuids
  RootItem ri;
  std::memcpy(&ri, root_item.data(), sizeof ri);
  Uuid u;
  if (!Zero(ri.uuid)) {
    std::memcpy(u.data(), ri.uuid, kUuidSize);
    expected_.insert({u, kUuidKeySubvol, id});
  }
  if (!Zero(ri.received_uuid)) {
    std::memcpy(u.data(), ri.received_uuid, kUuidSize);
    expected_.insert({u, kUuidKeyReceivedSubvol, id});
  }
}

void UuidTreeCheck::Item(const Key& k, std::span<const uint8_t> d, Report* report) {
  if (k.type != kUuidKeySubvol && k.type != kUuidKeyReceivedSubvol) return;
  if (d.size() % 8 != 0) {
    report->Error("uuid tree: " + KeyToString(k) + " is " + std::to_string(d.size()) +
                  " bytes, not a list of 8-byte subvolume ids");
    return;
  }
  Uuid u;
  StoreLe<uint64_t>(u.data(), k.objectid);
  StoreLe<uint64_t>(u.data() + 8, k.offset);
  for (size_t i = 0; i < d.size(); i += 8) found_.insert({u, k.type, LoadLe<uint64_t>(d.data() + i)});
}

void UuidTreeCheck::Finish(bool current, bool have_tree, Report* report) const {
  if (!current || !have_tree) return;
  for (const auto& e : expected_) {
    if (found_.count(e)) continue;
    const auto& [u, type, id] = e;
    report->Error("uuid tree: no entry for the " + Describe(type, u.data(), id) +
                  ", though the superblock's uuid_tree_generation says the tree is current (the kernel will not "
                  "rescan it)");
  }
  for (const auto& e : found_) {
    if (expected_.count(e)) continue;
    const auto& [u, type, id] = e;
    report->Warning("uuid tree: a stale entry for the " + Describe(type, u.data(), id) +
                    ", which no subvolume has (harmless: lookups check what they find)");
  }
}

}  // namespace ubtrfs::check
