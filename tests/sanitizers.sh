#!/bin/sh
# The mount tests on the ASan+UBSan build (build-asan/): see variant.sh.
exec "$(dirname "$0")/variant.sh" asan
