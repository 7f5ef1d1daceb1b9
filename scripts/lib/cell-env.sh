# Sourced by scripts/test and scripts/repeat. `cell_env CELL` sets the array `env` to the
# variables that make the integration tests run CELL of the matrix (scripts/test says which
# cells there are), from the peers' variables (scripts/peers) already in the environment.
cell_env() {
    env=()
    case $1 in
        debian) env=(CHALK_CONTAINERD= CHALK_CTR= CHALK_RUNSC=) ;;
        current) env=(CHALK_CONTAINERD="$CHALK_CONTAINERD" CHALK_CTR="$CHALK_CTR" CHALK_RUNSC="$CHALK_RUNSC") ;;
        containerd2) env=(CHALK_CONTAINERD="$CHALK_CONTAINERD" CHALK_CTR="$CHALK_CTR" CHALK_RUNSC=) ;;
        runsc-current) env=(CHALK_RUNSC="$CHALK_RUNSC") ;;
        containerd17) env=(CHALK_CONTAINERD="$CHALK_CONTAINERD17" CHALK_CTR="$CHALK_CTR17" CHALK_RUNSC="$CHALK_RUNSC") ;;
        current-cow) env=(CHALK_CONTAINERD="$CHALK_CONTAINERD" CHALK_CTR="$CHALK_CTR" CHALK_RUNSC="$CHALK_RUNSC_COW") ;;
        *) echo "unknown matrix cell: $1" >&2; return 2 ;;
    esac
}

# `other_runsc CELL`: the runsc the travel tests' third host runs, to be refused: the other
# cell's (the current runsc beside Debian's, Debian's beside a current one).
other_runsc() {
    case $1 in
        debian | containerd2) echo "${CHALK_RUNSC:-}" ;;
        *) echo /usr/bin/runsc ;;
    esac
}
