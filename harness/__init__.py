"""Process tooling shared by the demo, the chaos suite, the benchmarks and the tests: start workers,
embedded stores, the verdict and the history checker. Above the runtime, below the CLI."""
