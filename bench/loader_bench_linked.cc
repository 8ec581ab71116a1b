// spawnpoint-loader-bench-linked: bench/loader_bench.cc as one libtorch-linked executable
// (the usual way to build a trainer), whose workers, re-running it, load libtorch first.
// spawnpoint-loader-bench is the same program split (agent/loader/split_trainer.h).
extern "C" int spawnpoint_trainer_main(int argc, char** argv);

int main(int argc, char** argv) { return spawnpoint_trainer_main(argc, argv); }
