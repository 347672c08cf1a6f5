#include "cli/commands.h"
#include "cli/image_options.h"
#include "cli/verbs.h"

#include <set>
#include <string>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {
namespace {
std::string g_subvol;
uint64_t g_subvolid = 0;
}  // namespace

void AddSubvolOptions(CLI::App* cmd) {
  cmd->add_option("--subvol", g_subvol, "Paths start at this subvolume (its path from the top level), as subvol=");
  cmd->add_option("--subvolid", g_subvolid, "Paths start at the subvolume with this id (5: the top level), as subvolid=");
}

void SubvolOptionsInto(OpenOptions* o) {
  o->subvol = g_subvol;
  o->subvolid = g_subvolid;
}

Result<std::unique_ptr<Filesystem>> OpenImage(const std::string& image, OpenOptions o) {
  SubvolOptionsInto(&o);
  PlacementInto(&o);
  return Filesystem::Open(image, o);
}

void RegisterCommands(CLI::App& app) {
  RegisterReadCommands(app);
  RegisterDumpTree(app);
  RegisterInspect(app);
  RegisterRescue(app);
  RegisterMkfs(app);
  RegisterResize(app);
  RegisterDevice(app);
  RegisterBalance(app);
  RegisterCheck(app);
  RegisterScrub(app);
  RegisterMount(app);
  RegisterStats(app);
  RegisterProperty(app);
  RegisterSubvolume(app);
  RegisterQuota(app);
  RegisterReceive(app);
  RegisterSend(app);
  RegisterVerbs(app, nullptr);
  RegisterEdit(app);
  RegisterVerity(app);
  for (auto* cmd : app.get_subcommands({})) AddPlacementOptions(cmd);
  for (auto* cmd : app.get_subcommands({})) {
    // The commands that read an image's files (a write with it is refused).
    static const std::set<std::string> kReaders = {"info", "ls", "cat", "cp", "find", "du", "df", "tree", "stat",
                                                   "getfattr", "mount", "send", "subvolume", "inspect", "dump-tree"};
    if (kReaders.count(cmd->get_name())) AddRescueOption(cmd);
  }
  for (auto* cmd : app.get_subcommands({})) {
    // Every subcommand that opens an image's file tree; not the ones that
    // read its trees raw, mkfs, and those with options of their own.
    static const std::set<std::string> kNoSubvol = {"dump-tree", "inspect", "rescue", "check", "scrub", "stats", "mkfs", "resize", "device", "balance", "mount", "property", "subvolume", "send", "quota", "fsverity"};
    if (!kNoSubvol.count(cmd->get_name())) AddSubvolOptions(cmd);
  }
}

}  // namespace ubtrfs::cli
