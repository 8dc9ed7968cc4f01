"""The clusterpolicy study: cluster_sim policies run as simrun units, tabled and ranked."""
