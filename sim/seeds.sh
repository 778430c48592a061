# Sourced by the table scripts (fast-onset-table.sh, precision-table.sh,
# hints-table.sh).

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

# worst_figures SUMMARY [EXTRA]: prints one JSON line of a run's figures
# from its summary.json: the worst account's (most over-admitted) reaction
# and release, the scenario's peak 6-s bucket, cost over the limit and
# falsely refused over every account, and its control RPCs and bytes a
# second, with the fields of the jq object EXTRA (over the summary, with
# the worst account as $w) after them.
worst_figures() {
    local extra=${2:-"{}"}
    jq -c "
      ([.accounts[] | select(.limit != null)] | max_by(.over_admitted)) as \$w
      | { account: \$w.account, reaction: \$w.reaction_s, release: \$w.release_s,
          peak: ([.accounts[].peak_6s_ratio | select(. != null)] | max),
          over: ([.accounts[].over_admitted] | add),
          false_rej: ([.accounts[].false_rejections] | add),
          rpcs: .control.rpcs_per_s, bytes: .control.bytes_per_s } + $extra" "$1"
}
