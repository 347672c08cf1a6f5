#ifndef UBTRFS_CLI_COMMANDS_H_
#define UBTRFS_CLI_COMMANDS_H_

#include <CLI/CLI.hpp>

#include <string>
#include <utility>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {

// Adds every subcommand to `app`; each sets the exit code through its callback.
void RegisterCommands(CLI::App& app);
int ExitCode();

// Subcommand registration, one file each.
void RegisterReadCommands(CLI::App& app);  // info, ls, cat, cp
void RegisterDumpTree(CLI::App& app);      // dump-tree
void RegisterInspect(CLI::App& app);       // inspect logical-resolve|inode-resolve|subvolid-resolve
void RegisterRescue(CLI::App& app);        // rescue zero-log, super-recover, fix-device-size, clear-uuid-tree
void RegisterMkfs(CLI::App& app);          // mkfs
// mkfs's options and action on `cmd`: the mkfs subcommand, or the whole
// command line of mkfs.ubtrfs (mkfs_main.cc).
void AddMkfsOptions(CLI::App* cmd);
void RegisterResize(CLI::App& app);        // resize (offline grow and shrink)
void RegisterDevice(CLI::App& app);        // device add|remove|replace (offline)
void RegisterBalance(CLI::App& app);       // balance --dconvert/--mconvert (offline)
void RegisterCheck(CLI::App& app);         // check
void RegisterScrub(CLI::App& app);         // scrub (every copy verified, bad ones rewritten)
void RegisterMount(CLI::App& app);         // mount (FUSE, src/fuse/)
void RegisterStats(CLI::App& app);         // stats
void RegisterProperty(CLI::App& app);
void RegisterSubvolume(CLI::App& app);     // subvolume create|snapshot|delete|list      // property get|set (a subvolume's ro flag)
void RegisterQuota(CLI::App& app);          // quota rescan
void RegisterReceive(CLI::App& app);        // receive (a btrfs send stream into an image)
void RegisterSend(CLI::App& app);           // send (a full stream of a read-only subvolume)
void RegisterEdit(CLI::App& app);          // edit (edit_command.cc); the verbs: verbs.h
void RegisterVerity(CLI::App& app);        // fsverity enable|measure (verity_command.cc)

// mount.fuse3 runs an /etc/fstab entry of type fuse.ubtrfs as
//   ubtrfs SOURCE MOUNTPOINT -o OPTIONS
// (the program named after the subtype, from the default PATH). When argv
// has that shape -- argv[1] an existing file or block device that is not a
// subcommand name, argv[2] a directory -- returns it with "mount" inserted
// after argv[0]; otherwise argv unchanged.
std::vector<char*> MountHelperArgv(const CLI::App& app, int argc, char** argv);

// `cp HOST IMAGE:PATH`: copies a host file or tree into an image.
// `compress`: "" or a --compress value (ALG[:LEVEL]).
void CopyIn(const std::string& host, const std::string& image, const std::string& path, const std::string& compress,
            bool reflink = false);
// `cp --reflink IMAGE:SRC IMAGE:DST` (reflink_copy.cc): a copy inside one
// image whose regular files share their data with the originals.
void CopyReflink(const std::string& image, const std::string& src_path, const std::string& dst_path);
// "a/b/c" -> ("a/b", "c"), ignoring trailing slashes.
std::pair<std::string, std::string> SplitLast(std::string path);
// Where `cp HOST IMAGE:PATH` puts HOST: inside PATH under HOST's own name
// when PATH is a directory (as cp -r), else as PATH itself.
Result<std::pair<InodeId, std::string>> CopyInTarget(Filesystem& fs, const std::string& host, const std::string& path);
// `ls [-l] [--json]` of one path of an open image (read_commands.cc), for the
// ls subcommand and the ls of an edit session.
Status ListPath(Filesystem& fs, const std::string& path, bool long_format, bool json);
// Splits "IMAGE:PATH" when IMAGE names an existing file or block device.
bool SplitImagePath(const std::string& arg, std::string* image, std::string* path);

void SetExitCode(int code);

// --subvol PATH and --subvolid ID (where an image's paths start, as the
// kernel's subvol= and subvolid= mount options), added to every subcommand
// that opens an image's file tree; SubvolOptionsInto copies what was given
// into the options of the open.
void AddSubvolOptions(CLI::App* cmd);
void SubvolOptionsInto(OpenOptions* o);
// Filesystem::Open(image, o) with the subvolume and placement options the
// command line gave.
Result<std::unique_ptr<Filesystem>> OpenImage(const std::string& image, OpenOptions o);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_COMMANDS_H_
