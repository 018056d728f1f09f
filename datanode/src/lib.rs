// datanode
