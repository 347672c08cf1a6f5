// Running a command that may hang (a test suite run again in a child, over a
// FUSE mount and a cluster): with a deadline, and when it passes, a report
// of what every process of the test is waiting for, so that a hang in CI
// names its place instead of only timing out.
#ifndef UBTRFS_TESTS_SUPPORT_DEADLINE_H_
#define UBTRFS_TESTS_SUPPORT_DEADLINE_H_

#include <string>
#include <vector>

#include "support/test_util.h"

namespace ubtrfs_test {

// Runs argv with stdout and stderr into `log_path` (its content comes back
// as `out`). Past `seconds`: `*overdue` is set to StuckReport() of the
// processes whose command line contains one of `watch` (the child included), the
// child and they are killed (SIGKILL), and exit_code is -2.
CommandResult RunCommandWithDeadline(const std::vector<std::string>& argv, const std::string& log_path, int seconds,
                                     const std::vector<std::string>& watch, std::string* overdue);

// For each process whose command line contains one of `watch`: its pid and
// command line, each thread's name, state and kernel wait channel, and
// (where gdb is installed) every thread's user-space backtrace.
std::string StuckReport(const std::vector<std::string>& watch);

}  // namespace ubtrfs_test

#endif  // UBTRFS_TESTS_SUPPORT_DEADLINE_H_
