// `ubtrfs fsverity enable IMAGE:PATH` and `ubtrfs fsverity measure
// IMAGE:PATH...`: fsverity-utils' two commands, on a file in an image
// (the kernel's ioctls need the file system mounted with verity built in);
// and `verify`, the check the kernel makes on every read, made whole.
#include <fmt/core.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {

struct EnableArgs {
  std::string target, hash_alg = "sha256", salt, signature;
  uint32_t block_size = 4096;
};

void Fail(const std::string& what, const Status& st) {
  fmt::print(stderr, "ubtrfs: fsverity: {}: {}\n", what, st.ToString());
  SetExitCode(1);
}

bool ParseHex(const std::string& hex, std::vector<uint8_t>* out) {
  if (hex.size() % 2) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<uint8_t>(hi * 16 + lo));
  }
  return true;
}

std::string Hex(const std::vector<uint8_t>& b) {
  std::string s;
  for (uint8_t c : b) s += fmt::format("{:02x}", c);
  return s;
}

std::string AlgName(uint8_t alg) { return alg == 1 ? "sha256" : alg == 2 ? "sha512" : fmt::format("alg{}", alg); }

void Enable(const EnableArgs& a) {
  std::string image, path;
  if (!SplitImagePath(a.target, &image, &path)) {
    fmt::print(stderr, "ubtrfs: fsverity: expected IMAGE:PATH, got '{}'\n", a.target);
    return SetExitCode(2);
  }
  VerityParams p;
  if (a.hash_alg == "sha256") {
    p.hash_algorithm = 1;
  } else if (a.hash_alg == "sha512") {
    p.hash_algorithm = 2;
  } else {
    fmt::print(stderr, "ubtrfs: fsverity: --hash-alg takes sha256 or sha512, not '{}'\n", a.hash_alg);
    return SetExitCode(2);
  }
  p.block_size = a.block_size;
  if (!ParseHex(a.salt, &p.salt)) {
    fmt::print(stderr, "ubtrfs: fsverity: --salt takes hexadecimal bytes, not '{}'\n", a.salt);
    return SetExitCode(2);
  }
  if (!a.signature.empty()) {
    std::ifstream in(a.signature, std::ios::binary);
    if (!in) {
      fmt::print(stderr, "ubtrfs: fsverity: cannot read the signature file '{}'\n", a.signature);
      return SetExitCode(2);
    }
    p.signature.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  OpenOptions o;
  o.writable = true;
  auto fs = OpenImage(image, o);
  if (!fs.ok()) return Fail(image, fs.status());
  auto id = (*fs)->Lookup(path);
  if (!id.ok()) return Fail(a.target, id.status());
  if (Status st = (*fs)->EnableVerity(*id, p); !st.ok()) return Fail(a.target, st);
  if (Status st = (*fs)->Commit(); !st.ok()) return Fail(image + ": commit", st);
}

// measure (print each digest) or verify (read each file against its tree).
void ForEach(const std::vector<std::string>& targets, bool verify) {
  for (const std::string& t : targets) {
    std::string image, path;
    if (!SplitImagePath(t, &image, &path)) {
      fmt::print(stderr, "ubtrfs: fsverity: expected IMAGE:PATH, got '{}'\n", t);
      SetExitCode(2);
      continue;
    }
    OpenOptions o;
    auto fs = OpenImage(image, o);
    if (!fs.ok()) {
      Fail(image, fs.status());
      continue;
    }
    auto id = (*fs)->Lookup(path);
    if (!id.ok()) {
      Fail(t, id.status());
      continue;
    }
    if (verify) {
      if (Status st = (*fs)->VerifyVerity(*id); !st.ok()) {
        Fail(t, st);
      } else {
        fmt::print("{}: data matches its Merkle tree\n", t);
      }
      continue;
    }
    auto v = (*fs)->GetVerity(*id);
    if (!v.ok()) {
      Fail(t, v.status());
    } else if (!*v) {
      // As `fsverity measure` (the ioctl's ENODATA).
      Fail(t, Status::Error(ENODATA, "file is not a verity file"));
    } else {
      fmt::print("{}:{} {}\n", AlgName((*v)->params.hash_algorithm), Hex((*v)->digest), t);
    }
  }
}

}  // namespace

void RegisterVerity(CLI::App& app) {
  static EnableArgs enable_args;
  static std::vector<std::string> measure_targets, verify_targets;
  auto* cmd = app.add_subcommand("fsverity", "fs-verity on files in an image, as fsverity-utils' fsverity");
  cmd->require_subcommand(1);
  auto* enable = cmd->add_subcommand("enable", "Build a file's Merkle tree and make its data read-only for good");
  enable->add_option("target", enable_args.target, "IMAGE:PATH of a regular file")->required();
  enable->add_option("--hash-alg", enable_args.hash_alg, "sha256 (default) or sha512");
  enable->add_option("--block-size", enable_args.block_size, "Merkle tree block size (default 4096)");
  enable->add_option("--salt", enable_args.salt, "Salt, in hexadecimal (at most 32 bytes)");
  enable->add_option("--signature", enable_args.signature, "A file whose bytes are stored as the signature");
  AddSubvolOptions(enable);
  enable->callback([] { Enable(enable_args); });
  auto* measure = cmd->add_subcommand("measure", "Print each verity file's digest (ALG:HEX PATH)");
  measure->add_option("targets", measure_targets, "IMAGE:PATH of verity files")->required();
  AddSubvolOptions(measure);
  measure->callback([] { ForEach(measure_targets, false); });
  auto* verify = cmd->add_subcommand("verify", "Read each verity file whole and check it against its Merkle tree");
  verify->add_option("targets", verify_targets, "IMAGE:PATH of verity files")->required();
  AddSubvolOptions(verify);
  verify->callback([] { ForEach(verify_targets, true); });
}

}  // namespace ubtrfs::cli
