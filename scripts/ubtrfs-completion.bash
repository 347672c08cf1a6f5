# bash completion for ubtrfs (installed as share/bash-completion/completions/ubtrfs).
# Completes subcommands, each subcommand's options, the values of a few
# options, and file names elsewhere (IMAGE:PATH arguments complete the image
# part). Keep the lists in step with `ubtrfs SUBCOMMAND --help`
# (tests/install/cli_docs_test.sh checks them).

_ubtrfs_subcommands="info ls cat cp dump-tree inspect rescue mkfs resize device balance check scrub mount stats property subvolume quota receive send fsverity mv ln chmod chown touch truncate
  setfattr getfattr stat find du df tree mkdir rm rmdir put edit"

# The subcommands of the subcommands that have them.
_ubtrfs_nested() {
  case "$1" in
    subvolume) echo "create snapshot delete list get-default set-default" ;;
    property) echo "get set" ;;
    quota) echo "rescan" ;;
    device) echo "add remove delete replace" ;;
    fsverity) echo "enable measure verify" ;;
    inspect) echo "logical-resolve inode-resolve subvolid-resolve find-root dump-super" ;;
    rescue) echo "zero-log super-recover fix-device-size clear-uuid-tree" ;;
  esac
}

# Options of each subcommand ("SUB" or "SUB NESTED"); every top-level one also
# takes -h/--help, --offset, --partition, --scan and --degraded.
_ubtrfs_options() {
  case "$1" in
    "subvolume create"|"subvolume delete"|"subvolume set-default"|"property get"|"property set")
      echo "-h --help --subvol --subvolid"; return ;;
    "subvolume snapshot") echo "-h --help -r --subvol --subvolid"; return ;;
    "subvolume list") echo "-h --help --json --subvol --subvolid"; return ;;
    "subvolume get-default") echo "-h --help --json"; return ;;
    "quota rescan") echo "-h --help"; return ;;
    "inspect logical-resolve") echo "-h --help -P -o"; return ;;
    "inspect inode-resolve") echo "-h --help --subvolid"; return ;;
    "inspect find-root") echo "-h --help -o --tree"; return ;;
    "inspect dump-super") echo "-h --help -f --full -a --all -s --super -F --force"; return ;;
    "inspect subvolid-resolve"|"rescue zero-log"|"rescue fix-device-size"|"rescue clear-uuid-tree")
      echo "-h --help"; return ;;
    "rescue super-recover") echo "-h --help -y --yes -v --verbose"; return ;;
    "fsverity enable") echo "-h --help --hash-alg --block-size --salt --signature --subvol --subvolid"; return ;;
    "fsverity measure"|"fsverity verify") echo "-h --help --subvol --subvolid"; return ;;
    "device add") echo "-h --help -f --force -q --quiet"; return ;;
    "device remove"|"device delete") echo "-h --help -q --quiet"; return ;;
    "device replace") echo "-h --help -f --force -q --quiet"; return ;;
  esac
  local common="-h --help --offset --partition --scan --degraded"
  # The subcommands that read files also take --rescue.
  case "$1" in
    info|ls|cat|cp|find|du|df|tree|stat|getfattr|send|subvolume|mount|inspect|dump-tree) common="$common --rescue --tree-root --super" ;;
  esac
  # The subcommands that reach files by path also choose a subvolume.
  case "$1" in
    info|ls|cat|cp|mount|receive|mv|ln|chmod|chown|touch|truncate|setfattr|getfattr|stat|find|du|df|tree|mkdir|rm|rmdir|put|edit)
      common="$common --subvol --subvolid" ;;
  esac
  case "$1" in
    property|subvolume|device|quota|fsverity|inspect|rescue) echo "$common" ;;
    receive) echo "$common -f --file --dump -v --verbose" ;;
    send) echo "$common -f --file -p --parent -c --clone-src --proto --compressed-data -v --verbose" ;;
    info) echo "$common --json" ;;
    cat|mv|chmod|chown|rmdir|put) echo "$common" ;;
    ls) echo "$common -l --json" ;;
    cp) echo "$common --strict --no-devices --no-xattrs --compress --reflink" ;;
    dump-tree) echo "$common -t --tree -b --block --follow -r --roots" ;;
    mkfs) echo "$common -d --data -m --metadata -b --size -n --nodesize -M --mixed -s --sectorsize --csum --checksum -L --label -U --uuid -r --rootdir --compress -O --features -u --subvol --inode-flags --owner --reflink --shrink --deterministic -K --nodiscard -f --force -q --quiet" ;;
    resize) echo "$common -q --quiet --shrink max min" ;;
    balance) echo "$common -d --dconvert --dusage -m --mconvert --musage -s --sconvert -f --force -q --quiet" ;;
    check) echo "$common --json --check-data-csum --max-errors -b --backup -r --tree-root -s --super" ;;
    scrub) echo "$common -r --readonly --json" ;;
    mount) echo "$common -o --options -f --foreground -d --debug" ;;
    stats) echo "$common --json" ;;
    ln) echo "$common -s --symbolic -f --force" ;;
    touch) echo "$common -c --no-create -a -m -d --date" ;;
    truncate) echo "$common -s --size -c --no-create" ;;
    setfattr) echo "$common -n --name -v --value -x --remove" ;;
    getfattr) echo "$common -n --name -d --dump -m --match --json" ;;
    stat) echo "$common --json" ;;
    find) echo "$common -name -type -maxdepth -mindepth" ;;
    du) echo "$common -s --summarize -a --all -b --bytes -h --human-readable --json" ;;
    df) echo "$common --json -h --human-readable" ;;
    tree) echo "$common -a --all -L --level" ;;
    mkdir) echo "$common -p --parents -m --mode" ;;
    rm) echo "$common -r -R --recursive -f --force" ;;
    edit) echo "$common -f --file" ;;
  esac
}

_ubtrfs() {
  local cur prev sub nested="" i
  cur="${COMP_WORDS[COMP_CWORD]}"
  prev=""
  [ "$COMP_CWORD" -gt 0 ] && prev="${COMP_WORDS[COMP_CWORD-1]}"
  COMPREPLY=()
  sub=""
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${COMP_WORDS[i]}" in
      -*) ;;
      *) sub="${COMP_WORDS[i]}"; break ;;
    esac
  done
  if [ -z "$sub" ]; then
    COMPREPLY=($(compgen -W "$_ubtrfs_subcommands -h --help" -- "$cur"))
    return 0
  fi
  # subvolume create, property get, ...: the second word, then its options.
  local words
  words=$(_ubtrfs_nested "$sub")
  if [ -n "$words" ]; then
    for ((i++; i < COMP_CWORD; i++)); do
      case "${COMP_WORDS[i]}" in
        -*) ;;
        *) if [[ " $words " == *" ${COMP_WORDS[i]} "* ]]; then nested="${COMP_WORDS[i]}"; break; fi ;;
      esac
    done
    if [ -z "$nested" ]; then
      if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$(_ubtrfs_options "$sub")" -- "$cur"))
      else
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
      fi
      return 0
    fi
    if [[ "$cur" == -* ]]; then
      COMPREPLY=($(compgen -W "$(_ubtrfs_options "$sub $nested")" -- "$cur"))
      return 0
    fi
  fi
  case "$sub:$prev" in
    dump-tree:-t|dump-tree:--tree)
      COMPREPLY=($(compgen -W "root chunk extent dev fs csum quota uuid free-space block-group data-reloc log" -- "$cur"))
      return 0 ;;
    mkfs:--csum|mkfs:--checksum)
      COMPREPLY=($(compgen -W "crc32c xxhash sha256 blake2" -- "$cur"))
      return 0 ;;
    mkfs:-d|mkfs:--data|mkfs:-m|mkfs:--metadata)
      COMPREPLY=($(compgen -W "single dup raid0 raid1 raid1c3 raid1c4 raid10 raid5 raid6" -- "$cur"))
      return 0 ;;
    mkfs:-n|mkfs:--nodesize)
      COMPREPLY=($(compgen -W "4096 8192 16384 32768 65536" -- "$cur"))
      return 0 ;;
    mkfs:-r|mkfs:--rootdir)
      COMPREPLY=($(compgen -f -- "$cur"))
      return 0 ;;
    mkfs:--compress|cp:--compress)
      COMPREPLY=($(compgen -W "zstd zlib lzo" -- "$cur"))
      return 0 ;;
    mount:-o|mount:--options)
      COMPREPLY=($(compgen -W "ro rw commit= attr_timeout= entry_timeout= negative_timeout= threads= readahead= noreaddirplus writeback_cache notreelog stats nodefault_permissions debug compress= compress-force= allow_other auto_unmount" -- "$cur"))
      return 0 ;;
    find:-type)
      COMPREPLY=($(compgen -W "f d l c b p s" -- "$cur"))
      return 0 ;;
    edit:-f|edit:--file)
      COMPREPLY=($(compgen -f -- "$cur"))
      return 0 ;;
    *:--offset|*:--partition|*:--scan|*:--subvol|*:--subvolid|*:--tree-root|*:--super|check:-r|check:-s|mkfs:-b|mkfs:--size|mkfs:-s|mkfs:--sectorsize|mkfs:-L|mkfs:--label|mkfs:-U|mkfs:--uuid|mkfs:--owner|mkfs:--inode-flags|\
    mkdir:-m|mkdir:--mode|dump-tree:-b|dump-tree:--block|check:--max-errors|touch:-d|touch:--date|\
    truncate:-s|truncate:--size|setfattr:-n|setfattr:--name|setfattr:-v|setfattr:--value|setfattr:-x|\
    setfattr:--remove|getfattr:-n|getfattr:--name|getfattr:-m|getfattr:--match|tree:-L|tree:--level|\
    find:-name|find:-maxdepth|find:-mindepth)
      return 0 ;;
  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$(_ubtrfs_options "$sub")" -- "$cur"))
    return 0
  fi
  # IMAGE:PATH: complete the image file name before the colon.
  if [[ "$cur" != *:* ]]; then
    COMPREPLY=($(compgen -f -- "$cur"))
    [ "$sub" = mount ] && COMPREPLY+=($(compgen -d -- "$cur"))
  fi
  return 0
}
complete -o default -o bashdefault -F _ubtrfs ubtrfs

# mkfs.ubtrfs takes `ubtrfs mkfs`'s options (installed under both names:
# bash-completion loads a command's completion by its name).
_mkfs_ubtrfs() {
  local COMP_WORDS=(ubtrfs mkfs "${COMP_WORDS[@]:1}")
  local COMP_CWORD=$((COMP_CWORD + 1))
  _ubtrfs
}
complete -o default -o bashdefault -F _mkfs_ubtrfs mkfs.ubtrfs
