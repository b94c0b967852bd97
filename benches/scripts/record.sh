# Sourced by the eval scripts. `record OUT N CMD...` runs CMD and writes
# OUT.txt: a header naming the commit (REV overrides it, for a binary built
# from another tree) and the command, then CMD's output without blank lines;
# it prints the file's last N lines.
record() {
  local out=$1 n=$2; shift 2
  {
    echo "# ${REV:-$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- engine service || echo ' + uncommitted changes')}, release build, 2 cores; $(date -u +%FT%TZ)"
    echo "# command: $(printf "%q " "$@")"
    "$@" 2>&1 | grep -v '^\s*$'
  } > "$out.txt"
  tail -n "$n" "$out.txt"
}
