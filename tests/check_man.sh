#!/bin/bash
# check_man.sh - the man pages cannot drift from the programs (issue 10):
#   every long option of `moverd --help` is in moverd.8, and every option
#   moverd.8 documents is in --help; the same for moverctl.8 and its
#   commands; every function of flowshm.h is in flowshm.3 and the reverse;
#   every flow parameter of `moverd --help` is in moverd.conf.5; and each
#   page formats without a warning (groff -ww, man --warnings).
# usage: check_man.sh MOVERD MOVERCTL MANDIR FLOWSHM_H
set -uo pipefail
moverd=$1 moverctl=$2 man=$3 header=$4
fail=0
bad() { echo "check_man: $*" >&2; fail=1; }

# --opt-name as roff writes it: \-\-opt\-name
roff() { sed 's/-/\\-/g' <<<"$1"; }
opts_of_help() { grep -o -- '--[a-z][a-z-]*[a-z]' | sort -u; }
opts_of_page() { grep -o -- '\\-\\-[a-z][a-z\\-]*[a-z]' "$1" | sed 's/\\-/-/g' | sort -u; }

# both ways: what --help has, the page has; what the page has, --help has
both_ways() { # PAGE HELP-TEXT
    local page=$1 help=$2 o
    for o in $(opts_of_help <<<"$help"); do
        grep -qF -- "$(roff "$o")" "$page" || bad "$(basename "$page"): $o (in --help) is missing"
    done
    for o in $(opts_of_page "$page"); do
        grep -qF -- "$o" <<<"$help" || bad "$(basename "$page"): $o is not in --help"
    done
}

mhelp=$("$moverd" --help) || bad "moverd --help failed"
chelp=$("$moverctl" --help) || bad "moverctl --help failed"
both_ways "$man/moverd.8" "$mhelp"
both_ways "$man/moverctl.8" "$chelp"

# moverctl's commands: the lines "  flow create", "  status", ... of --help
for c in $(sed -n '/^commands:/,/^$/p' <<<"$chelp" |
           grep -oE '^  (flow [a-z]+|[a-z]+)' | sed 's/^  //; s/ /_/'); do
    grep -qE "^\.BI? \"?${c/_/ }" "$man/moverctl.8" ||
        bad "moverctl.8: command '${c/_/ }' (in --help) is missing"
done
for c in $(grep -oE '^\.BI? "?(flow [a-z]+|[a-z]+)' "$man/moverctl.8" |
           sed -n '/SH/!p' | sed 's/^\.BI\? "\?//' | sort -u | tr ' ' _); do
    case $c in flow_*|status|reload|keygen|help)
        grep -qE "^  ${c/_/ }" <<<"$chelp" ||
            bad "moverctl.8: command '${c/_/ }' is not in --help" ;;
    esac
done

# flowshm.h's functions
for fn in $(grep -oE '\bflowshm_[a-z_]+\(' "$header" | tr -d '(' | sort -u); do
    grep -qF "$fn" "$man/flowshm.3" || bad "flowshm.3: $fn (in flowshm.h) is missing"
done
for fn in $(grep -oE '\bflowshm_[a-z_]+' "$man/flowshm.3" | sort -u); do
    grep -qw "$fn" "$header" || bad "flowshm.3: $fn is not in flowshm.h"
done

# the flow parameters moverd --help names: [ring-size=N] ...
for k in $(grep -oE '\[[a-z-]+=' <<<"$mhelp" | tr -d '[=' | sort -u); do
    grep -qF -- "$(roff "$k")=" "$man/moverd.conf.5" ||
        bad "moverd.conf.5: flow parameter $k (in moverd --help) is missing"
done

# formatting
for p in "$man"/*.[358]; do
    if command -v groff >/dev/null; then
        w=$(groff -ww -z -man "$p" 2>&1) || bad "$p: groff failed"
        [ -z "$w" ] || bad "$p: groff: $w"
    fi
    if command -v man >/dev/null; then
        w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -l "$p" 2>&1 >/dev/null)
        [ -z "$w" ] || bad "$p: man: $w"
    fi
done
command -v groff >/dev/null || echo "check_man: groff absent: formatting not checked (install groff-base)"

[ $fail = 0 ] && echo "check_man: moverd.8, moverctl.8, moverd.conf.5, flowshm.3 agree with the programs"
exit $fail
