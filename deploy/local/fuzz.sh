#!/usr/bin/env bash
# deploy/local/fuzz.sh — runs every native Go fuzz target for FUZZTIME, one
# after another (a fuzzer already uses every core), and exits non-zero if any
# of them fails. Called by `make fuzz` and CI.
#
#   FUZZTIME   how long each target fuzzes: a duration (10s, 1m) or a count
#              of executions (1000x); default 10s
#
# Plain `go test` runs each target's seeds and its committed corpus
# (testdata/fuzz/<Target>/ in the package) without fuzzing. A failure found
# here is written to that directory by `go test`: fix the bug and commit the
# input with the fix, so the corpus keeps it from coming back.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FUZZTIME=${FUZZTIME:-10s}

cd "$ROOT"
# Every fuzz target in the repository, as "Target ./package": found in the
# source, so a new one is fuzzed without being listed (a hand-kept list once
# missed FuzzClient).
mapfile -t TARGETS < <(git ls-files '*_test.go' | xargs grep -H '^func Fuzz[A-Za-z0-9_]*(f \*testing.F)' |
	sed -E 's#^(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*#\2 ./\1#' | sort -u)
if ((${#TARGETS[@]} == 0)); then
	echo "fuzz.sh: no fuzz targets found" >&2
	exit 1
fi

# inputs counts a corpus directory's files (0 when it does not exist yet).
inputs() { { ls "$1" 2>/dev/null || true; } | wc -l; }

passed=0 failed=() t0=$SECONDS
for entry in "${TARGETS[@]}"; do
	read -r target pkg <<<"$entry"
	printf '== %s %s (%s)\n' "$target" "$pkg" "$FUZZTIME"
	t=$SECONDS
	# go test passes when -fuzz matches nothing: a renamed target must fail.
	file=$(grep -l "^func ${target}(f \*testing.F)" "$pkg"/*_test.go || true)
	if [[ -z $file ]]; then
		failed+=("$target $pkg")
		printf 'FAIL  %s %s: no such fuzz target\n' "$target" "$pkg"
		continue
	fi
	# A target in an integration-tier file is built only with the tag (and
	# then needs the stack up, as under make test).
	tags=()
	if head -1 "$file" | grep -qx '//go:build integration'; then
		tags=(-tags integration)
	fi
	corpus="$pkg/testdata/fuzz/$target"
	before=$(inputs "$corpus")
	out=$(mktemp)
	if go test "${tags[@]}" -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$pkg" 2>&1 | tee "$out"; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
		passed=$((passed + 1))
		printf 'ok    %s %s in %ds\n' "$target" "$pkg" $((SECONDS - t))
	elif grep -qE '^[[:space:]]+context deadline exceeded$' "$out" &&
		! grep -q 'Failing input written to' "$out" &&
		[[ $(inputs "$corpus") -eq $before ]] &&
		go test "${tags[@]}" -count=1 -run "^${target}\$" "$pkg" >/dev/null; then
		# Go's fuzzing coordinator can fail a target at the end of its
		# -fuzztime with a bare "context deadline exceeded" and nothing found
		# (a race between its deadline and its workers' stop). No input was
		# written and the seeds and corpus replay clean: not a finding.
		passed=$((passed + 1))
		printf 'ok    %s %s in %ds (the coordinator'"'"'s deadline race; nothing found, corpus replays clean)\n' "$target" "$pkg" $((SECONDS - t))
	else
		failed+=("$target $pkg")
		printf 'FAIL  %s %s\n' "$target" "$pkg"
	fi
	rm -f "$out"
done

printf '\n%d of %d fuzz targets passed in %ds\n' "$passed" "${#TARGETS[@]}" $((SECONDS - t0))
if ((${#failed[@]} > 0)); then
	printf 'failed: %s\n' "${failed[@]}"
	exit 1
fi
