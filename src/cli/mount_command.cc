// `ubtrfs mount IMAGE MOUNTPOINT [-o OPTIONS] [-f]`: serve an image
// through FUSE (src/fuse/) until it is unmounted. Also the mount helper
// convention of mount.fuse3 (MountHelperArgv).
#include <sys/stat.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "cli/image_options.h"
#include "fuse/mount.h"
#include "ubtrfs/devices.h"

namespace ubtrfs::cli {

void RegisterMount(CLI::App& app) {
  static fuse::MountConfig config;
  auto* m = app.add_subcommand("mount", "Mount an image through FUSE (unmount with fusermount3 -u or umount)");
  m->add_option("image", config.image, "Image file or block device")->required();
  m->add_option("mountpoint", config.mountpoint, "Directory to mount on")->required();
  m->add_option("-o,--options", config.options,
                "Mount options, comma-separated: ro, commit=SECONDS (default 30), attr_timeout=, "
                "entry_timeout=, negative_timeout= (seconds, default 1), threads=N (request threads, default the number of cores, 2 to 10), readahead=KIB (default 4096, as kernel btrfs; as root), noreaddirplus, "
                "writeback_cache, notreelog (fsync commits in full), stats, nodefault_permissions, debug, subvol=PATH, subvolid=ID, "
                "compress[=ALG[:LEVEL]], compress-force[=ALG[:LEVEL]], rescue=A:B (with ro); others go to FUSE "
                "(allow_other, auto_unmount, ...)")
      ->allow_extra_args(false);
  static std::string subvol;
  static uint64_t subvolid = 0;
  m->add_option("--subvol", subvol, "Mount this subvolume (its path from the top level), as -o subvol=");
  m->add_option("--subvolid", subvolid, "Mount the subvolume with this id (5: the top level), as -o subvolid=");
  m->add_flag("-f,--foreground", config.foreground, "Stay in the foreground");
  m->add_flag("-d,--debug", config.debug, "Trace FUSE requests (implies -f)");
  m->callback([] {
    if (config.debug) config.foreground = true;
    if (!subvol.empty()) config.options.push_back("subvol=" + subvol);
    if (subvolid != 0) config.options.push_back("subvolid=" + std::to_string(subvolid));
    config.offset = Placement().offset;
    config.partition = Placement().partition;
    config.scan_dirs = Placement().scan_dirs;
    config.degraded = Placement().degraded;
    config.rescue = Placement().rescue;
    SetExitCode(fuse::RunMount(config));
  });
}

std::vector<char*> MountHelperArgv(const CLI::App& app, int argc, char** argv) {
  std::vector<char*> out(argv, argv + argc);
  if (argc < 3 || argv[1][0] == '-' || argv[2][0] == '-') return out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(argv[1])) return out;
  }
  struct stat src, dir;
  for (const auto& dev : SplitDeviceList(argv[1])) {
    if (dev.starts_with("rbd:")) continue;
    if (::stat(dev.c_str(), &src) != 0 || !(S_ISREG(src.st_mode) || S_ISBLK(src.st_mode))) return out;
  }
  if (::stat(argv[2], &dir) != 0 || !S_ISDIR(dir.st_mode)) return out;
  static char mount_word[] = "mount";
  out.insert(out.begin() + 1, mount_word);
  return out;
}

}  // namespace ubtrfs::cli
