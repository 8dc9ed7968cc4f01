"""The control-plane domain that simrun's services share."""
