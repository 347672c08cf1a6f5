#include "fuse/posix_acl.h"

namespace ubtrfs::fuse::acl {
namespace {

constexpr uint32_t kVersion = 2;
constexpr size_t kHeader = 4, kEntrySize = 8;

uint16_t Get16(std::string_view s, size_t at) {
  return static_cast<uint16_t>(static_cast<uint8_t>(s[at]) | static_cast<uint8_t>(s[at + 1]) << 8);
}
uint32_t Get32(std::string_view s, size_t at) {
  return static_cast<uint32_t>(Get16(s, at)) | static_cast<uint32_t>(Get16(s, at + 2)) << 16;
}
void Put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}
void Put32(std::string& s, uint32_t v) {
  Put16(s, static_cast<uint16_t>(v & 0xffff));
  Put16(s, static_cast<uint16_t>(v >> 16));
}

}  // namespace

std::optional<Acl> Parse(std::string_view x) {
  if (x.size() < kHeader || (x.size() - kHeader) % kEntrySize != 0 || Get32(x, 0) != kVersion) return std::nullopt;
  Acl acl;
  int user_obj = 0, group_obj = 0, other = 0, mask = 0, named = 0;
  uint16_t last_tag = 0;
  uint32_t last_id = 0;
  for (size_t at = kHeader; at < x.size(); at += kEntrySize) {
    Entry e{Get16(x, at), Get16(x, at + 2), Get32(x, at + 4)};
    if (e.perm & ~7u) return std::nullopt;
    switch (e.tag) {
      case kUserObj: ++user_obj; e.id = 0xffffffff; break;
      case kGroupObj: ++group_obj; e.id = 0xffffffff; break;
      case kOther: ++other; e.id = 0xffffffff; break;
      case kMask: ++mask; e.id = 0xffffffff; break;
      case kUser: case kGroup: ++named; break;
      default: return std::nullopt;
    }
    // Tags ascend; named entries of one tag ascend by id.
    if (e.tag < last_tag) return std::nullopt;
    if (e.tag == last_tag && (e.tag == kUser || e.tag == kGroup ? e.id <= last_id : true)) return std::nullopt;
    last_tag = e.tag;
    last_id = e.id;
    acl.push_back(e);
  }
  if (user_obj != 1 || group_obj != 1 || other != 1 || mask > 1 || (named && !mask)) return std::nullopt;
  return acl;
}

std::string Serialize(const Acl& acl) {
  std::string s;
  Put32(s, kVersion);
  for (const auto& e : acl) {
    Put16(s, e.tag);
    Put16(s, e.perm);
    Put32(s, e.id);
  }
  return s;
}

uint32_t ModeBits(const Acl& acl, bool* equivalent) {
  uint32_t mode = 0;
  bool equiv = true;
  for (const auto& e : acl) {
    switch (e.tag) {
      case kUserObj: mode |= (e.perm & 7u) << 6; break;
      case kGroupObj: mode |= (e.perm & 7u) << 3; break;
      case kOther: mode |= e.perm & 7u; break;
      case kMask:
        mode = (mode & ~070u) | (e.perm & 7u) << 3;
        equiv = false;
        break;
      default: equiv = false; break;
    }
  }
  // A mask before the group entry is impossible (tags ascend), so the mask's
  // bits win as above.
  if (equivalent) *equivalent = equiv;
  return mode;
}

Acl Chmod(Acl acl, uint32_t mode) {
  bool has_mask = false;
  for (const auto& e : acl) has_mask |= e.tag == kMask;
  for (auto& e : acl) {
    switch (e.tag) {
      case kUserObj: e.perm = static_cast<uint16_t>((mode >> 6) & 7); break;
      case kMask: e.perm = static_cast<uint16_t>((mode >> 3) & 7); break;
      case kGroupObj:
        if (!has_mask) e.perm = static_cast<uint16_t>((mode >> 3) & 7);
        break;
      case kOther: e.perm = static_cast<uint16_t>(mode & 7); break;
    }
  }
  return acl;
}

std::optional<Acl> CreateMasq(Acl acl, uint32_t* mode_p) {
  uint32_t mode = *mode_p;
  bool not_equiv = false;
  Entry* group_obj = nullptr;
  Entry* mask = nullptr;
  for (auto& e : acl) {
    switch (e.tag) {
      case kUserObj:
        e.perm &= static_cast<uint16_t>((mode >> 6) & 7);
        mode &= (static_cast<uint32_t>(e.perm) << 6) | ~0700u;
        break;
      case kUser: case kGroup: not_equiv = true; break;
      case kGroupObj: group_obj = &e; break;
      case kOther:
        e.perm &= static_cast<uint16_t>(mode & 7);
        mode &= e.perm | ~07u;
        break;
      case kMask:
        mask = &e;
        not_equiv = true;
        break;
    }
  }
  Entry* g = mask ? mask : group_obj;
  if (g) {
    g->perm &= static_cast<uint16_t>((mode >> 3) & 7);
    mode &= (static_cast<uint32_t>(g->perm) << 3) | ~070u;
  }
  *mode_p = mode;
  if (!not_equiv) return std::nullopt;
  return acl;
}

}  // namespace ubtrfs::fuse::acl
