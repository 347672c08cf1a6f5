// Editing verbs (mv, ln, chmod, chown, touch, truncate, setfattr, getfattr,
// stat, find, du, df, put, tree, mkdir, rm, rmdir, cat, copy-in, copy-out):
// one definition each, used two ways --
//   - as subcommands, on IMAGE:PATH arguments: the verb opens the image,
//     applies itself and commits (one transaction per command);
//   - in `ubtrfs edit IMAGE` (edit_command.cc), on paths inside the image
//     of the session, all of a script in one transaction.
// Behaviour and messages follow the coreutils / attr equivalents.
#ifndef UBTRFS_CLI_VERBS_H_
#define UBTRFS_CLI_VERBS_H_

#include <CLI/CLI.hpp>

#include <string>

#include "ubtrfs/filesystem.h"

namespace ubtrfs::cli {

struct VerbSession {
  Filesystem* fs = nullptr;  // the edit session's image (null: each verb opens its IMAGE:PATH)
  Status status;             // an edit session: the failure of the verb that ran
  bool writes = false;       // the verb that ran is one that changes the image
};

// Registers the verbs on `app`. With a session, paths are inside its image
// and the session-only verbs (copy-in, copy-out, commit is the caller's)
// are added; without one, the verbs take IMAGE:PATH and report through the
// exit code.
void RegisterVerbs(CLI::App& app, VerbSession* session);

}  // namespace ubtrfs::cli

#endif  // UBTRFS_CLI_VERBS_H_
