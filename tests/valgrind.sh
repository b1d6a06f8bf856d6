#!/bin/sh
# The mount tests with the daemon under valgrind: see variant.sh.
exec "$(dirname "$0")/variant.sh" valgrind
