"""pkscan: a dose scan of a one-compartment pharmacokinetic model, read from models/ and data/ beside it."""
