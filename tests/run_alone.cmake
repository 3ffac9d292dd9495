# Included by ctest after the discovered gtest cases (TEST_INCLUDE_FILES in
# tests/CMakeLists.txt): the tests that a busy machine can defeat run alone,
# the others three at a time (scripts/test.sh). The attacker must catch a
# mesh while it forms, which needs the machine to itself. A tree that built
# only the unit suite (scripts/sanitize.sh) has not discovered it.
list(FIND erun_transport_test_TESTS "ErunTransport.UnprivilegedAttackerOnTheWorkersPortsChangesNothing" _at)
if(NOT _at EQUAL -1)
  set_tests_properties("ErunTransport.UnprivilegedAttackerOnTheWorkersPortsChangesNothing" PROPERTIES RUN_SERIAL TRUE)
endif()
