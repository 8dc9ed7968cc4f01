"""The gateway: authentication, identities and composition."""
