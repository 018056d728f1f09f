// client
