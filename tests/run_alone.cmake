# Included by ctest after the discovered gtest cases (TEST_INCLUDE_FILES in
# tests/CMakeLists.txt): the tests that a busy machine can defeat run alone,
# the others three at a time (scripts/test.sh). The attacker must catch a
# mesh while it forms, which needs the machine to itself. A tree that built
# only the unit suite (scripts/sanitize.sh) has not discovered it.
list(FIND erun_transport_test_TESTS "ErunTransport.UnprivilegedAttackerOnTheWorkersPortsChangesNothing" _at)
if(NOT _at EQUAL -1)
  set_tests_properties("ErunTransport.UnprivilegedAttackerOnTheWorkersPortsChangesNothing" PROPERTIES RUN_SERIAL TRUE)
endif()
# The pre-flight check times a new host's probe against the members' probes
# at their start: beside two torch jobs a healthy host's probe took 8x the
# median (a run of 2026-11-28), so the test of telling a slow host from a
# healthy one needs the machine to itself too.
list(FIND erun_stragglers_test_TESTS "ErunStragglers.ANewHostSlowAtThePreflightCheckIsHeldBackAndAHealthyOneJoins" _pf)
if(NOT _pf EQUAL -1)
  set_tests_properties("ErunStragglers.ANewHostSlowAtThePreflightCheckIsHeldBackAndAHealthyOneJoins"
                       PROPERTIES RUN_SERIAL TRUE)
endif()
