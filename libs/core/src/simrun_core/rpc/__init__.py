"""The gRPC plumbing shared by simrun's services: error mapping, authentication, the server factory."""
