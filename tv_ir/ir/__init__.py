"""The program: tv's IR, its decoded attributes, and importing StableHLO/HLO into it."""
