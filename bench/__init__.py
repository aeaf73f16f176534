"""fabric-dra benchmarks. Figures are measured here, never asserted in tests."""
