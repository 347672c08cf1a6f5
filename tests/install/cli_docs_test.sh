#!/usr/bin/env bash
# The man page and the bash completion against the command's own --help
# (ctest: cli_docs_test):  cli_docs_test.sh UBTRFS MANPAGE COMPLETION
# Every subcommand `ubtrfs --help` lists has a section in the man page and is
# completed; every option of `ubtrfs SUB --help` is in that section (or, for
# the options every subcommand takes, in the page's OPTIONS section) and in the
# completion's option list for SUB. The page renders with no warning.
set -euo pipefail
bin=$1 page=$2 completion=$3
fail=0
err() { echo "cli_docs_test: $*" >&2; fail=1; }

warnings=$(groff -man -Tutf8 -ww -z "$page" 2>&1 || true)
[ -z "$warnings" ] || err "groff -ww $page: $warnings"
rendered=$(MANWIDTH=200 man -l "$page" 2>/dev/null | col -bx)
[ -n "$rendered" ] || err "man -l $page rendered nothing"

global=$(awk '/^OPTIONS/{on=1; next} on && /^[^ ]/{exit} on{print}' <<<"$rendered")
subs=$("$bin" --help | awk '/^Subcommands:/{s=1; next} s && /^  [a-z]/{print $1}')
[ -n "$subs" ] || err "no subcommands in $bin --help"
# shellcheck disable=SC1090
source "$completion"
for sub in $subs; do
  # The man page section: from "   SUB ..." to the next section header.
  section=$(awk -v s="$sub" '$0 ~ "^   " s "( |$)" {on=1; print; next} on && /^(   )?[^ ]/ {exit} on {print}' <<<"$rendered")
  [ -n "$section" ] || { err "man page: no section for '$sub'"; continue; }
  [[ " $(echo $_ubtrfs_subcommands) " == *" $sub "* ]] || err "completion: subcommand '$sub' missing"
  comp=" $(_ubtrfs_options "$sub") "
  opts=$("$bin" "$sub" --help | awk '/^Options:/{s=1; next} s && /^  +-/{print $1}' | sed 's/{[^}]*}//; s/,/ /g')
  for o in $opts; do
    # Options every subcommand has (-h/--help, --partition, --offset) are
    # documented once, in the page's OPTIONS section.
    if ! grep -qE -- "(^|[ ,(])$o([ ,=.)]|\$)" <<<"$section" &&
       ! grep -qE -- "^ +(-[a-z], )?$o([ ,]|$)" <<<"$global"; then
      err "man page: '$sub' section does not mention $o"
    fi
    [[ "$comp" == *" $o "* ]] || err "completion: '$sub' does not offer $o"
  done
done
# Subcommands of subcommands (subvolume create, property get, ...): completed
# after their parent, and their options completed and in the parent's section.
complete_words() {  # complete_words WORD... : what completing the last word offers
  COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
  _ubtrfs; printf "%s\n" "${COMPREPLY[@]}"
}
for sub in $subs; do
  nested=$("$bin" "$sub" --help | awk '/^Subcommands:/{s=1; next} s && /^  [a-z]/{sub(",", "", $1); print $1}')
  [ -n "$nested" ] || continue
  section=$(awk -v s="$sub" '$0 ~ "^   " s "( |$)" {on=1; print; next} on && /^(   )?[^ ]/ {exit} on {print}' <<<"$rendered")
  offered=" $(complete_words ubtrfs "$sub" "" | tr '\n' ' ') "
  for n in $nested; do
    [[ "$offered" == *" $n "* ]] || err "completion: 'ubtrfs $sub ' does not offer $n"
    grep -qE -- "(^|[ |])$n([ |]|\$)" <<<"$section" || err "man page: '$sub' section does not mention $n"
    comp=" $(complete_words ubtrfs "$sub" "$n" - | tr '\n' ' ') "
    opts=$("$bin" "$sub" "$n" --help | awk '/^Options:/{s=1; next} s && /^  +-/{print $1}' | sed 's/{[^}]*}//; s/,/ /g')
    for o in $opts; do
      [[ "$comp" == *" $o "* ]] || err "completion: '$sub $n -' does not offer $o"
      if ! grep -qE -- "(^|[ ,(\[])$o([] ,=.)]|\$)" <<<"$section" &&
         ! grep -qE -- "^ +(-[a-z], )?$o([ ,]|$)" <<<"$global"; then
        err "man page: '$sub' section does not mention $o (of $sub $n)"
      fi
    done
  done
done

# The commands of an edit session (its `help`) are each named in the page's
# edit section.
scratch=$(mktemp -d /tmp/cli_docs_test.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
"$bin" mkfs -q --size 128M "$scratch/img"
edit_cmds=$(printf 'help\n' | "$bin" edit "$scratch/img" | awk '/^  [a-z]/{print $1}')
[ -n "$edit_cmds" ] || err "edit: 'help' listed no commands"
# (man hyphenates long words at line ends: join them first)
edit_section=$(awk '$0 ~ "^   edit( |$)" {on=1; print; next} on && /^(   )?[^ ]/ {exit} on {print}' <<<"$rendered" |
               sed -z 's/\xe2\x80\x90\n *//g; s/-\n *//g' | tr '\n' ' ')
for c in $edit_cmds commit abort; do
  grep -qE -- "(^|[ (,])$c([ ,.;)]|\$)" <<<"$edit_section" || err "man page: the edit section does not name '$c'"
done

grep -qE -- "^ +-h, --help" <<<"$rendered" || err "man page: -h, --help not in OPTIONS"
[ $fail -eq 0 ] && echo "cli_docs_test: $(wc -w <<<"$subs") subcommands, man page and completion agree with --help"
exit $fail
