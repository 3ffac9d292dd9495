# ctest's LastTest.log -> each failed test's name and the first lines of its
# gtest failures ("file:line: Failure" and the four lines after it), at most
# 12 lines a test. scripts/test.sh prints this last when ctest fails, so that
# the tail of a CI log says what failed and where, not only which test.
/^[0-9]+\/[0-9]+ Test: / { name = $3; n = 0; lines = ""; have = 0; take = 0; next }
/: Failure$/ { have = 1; take = 5 }
take > 0 { if (n < 12) lines = lines "    " substr($0, 1, 200) "\n"; n++; take--; next }
/^Test Failed\./ {
  printf "%s:\n%s", name, (have ? lines : "    (no gtest failure line: a timeout, a crash or a fixture's error)\n")
}
