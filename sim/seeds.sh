# Sourced by the table scripts (fast-onset-table.sh, precision-table.sh).

# table_setup "$@": reads `--seeds N` (default 0: each scenario's own
# seed), builds damper-sim in release mode, and sets `seeds`, `bin` and
# `work` (a temporary directory, removed on exit).
table_setup() {
    seeds=0
    if [[ "${1:-}" == "--seeds" ]]; then
        seeds=${2:?--seeds needs a count}
    fi
    cargo build -q --release -p damper-sim
    bin=${CARGO_TARGET_DIR:-target}/release/damper-sim
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
}

# for_seeds SEEDS FILE OUT WORK CMD...: writes to OUT what `CMD... SCENARIO`
# prints, with SCENARIO the file FILE itself when SEEDS is 0, and otherwise
# a copy of it (in the directory WORK) with each seed from 1 to SEEDS.
for_seeds() {
    local seeds=$1 file=$2 out=$3 work=$4
    shift 4
    : >"$out"
    if [[ $seeds -eq 0 ]]; then
        "$@" "$file" >>"$out"
        return
    fi
    for seed in $(seq 1 "$seeds"); do
        sed "s/^seed = .*/seed = $seed/" "$file" >"$work/s.toml"
        grep -q '^seed' "$work/s.toml" || sed -i "1a seed = $seed" "$work/s.toml"
        "$@" "$work/s.toml" >>"$out"
    done
}

# runs_for_all SEEDS WORK VARIANTS CMD: for every shipped scenario NAME and
# each variant V of the words in VARIANTS, writes WORK/NAME-V.jsonl from
# `CMD V WORK/out SCENARIO` (see for_seeds).
runs_for_all() {
    local seeds=$1 work=$2 variants=$3 cmd=$4 file name v
    for file in sim/scenarios/*.toml; do
        name=$(basename "$file" .toml)
        for v in $variants; do
            for_seeds "$seeds" "$file" "$work/$name-$v.jsonl" "$work" "$cmd" "$v" "$work/out"
        done
    done
}
