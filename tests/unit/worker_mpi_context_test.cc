// Which environments count as "started by an MPI launcher" for erun::init().
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "worker/mpi_context.h"

namespace erun {
namespace {

bool detect(std::map<std::string, std::string> vars) {
  return launched_by_mpi([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(MpiDetection, MpirunPmiAndMultiTaskSrunCount) {
  EXPECT_TRUE(detect({{"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_TRUE(detect({{"PMI_SIZE", "2"}}));
  EXPECT_TRUE(detect({{"PMIX_RANK", "0"}}));
  EXPECT_TRUE(detect({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}));
}

TEST(MpiDetection, AloneSingleTaskStepsAndAllocationsDoNot) {
  EXPECT_FALSE(detect({}));
  EXPECT_FALSE(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}));   // erun's own srun steps
  EXPECT_FALSE(detect({{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "8"}}));   // inside salloc, no step
  EXPECT_FALSE(detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "x"}}));
}

TEST(MpiDetection, TheErunDriverAlwaysWins) {
  EXPECT_FALSE(detect({{"ERUN_RDZV_ADDR", "10.0.0.1"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  EXPECT_FALSE(detect({{"ERUN_RDZV_ADDR", "n1"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}}));
}

}  // namespace
}  // namespace erun
