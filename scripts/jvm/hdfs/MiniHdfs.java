/*
 * MiniHdfs: a real HDFS (one NameNode, 1..3 DataNodes) in one JVM, for Weir's tests.
 *
 * Usage: java -cp 'var/jvm/hdfs/lib/*' scripts/jvm/hdfs/MiniHdfs.java BASE_DIR [options]
 *   --datanodes N      DataNodes to start, 1..3 (default 1)
 *   --port P           NameNode RPC port (default 0: a free one)
 *   --permissions on|off   dfs.permissions.enabled (default off)
 *   --replication R    dfs.replication (default: min(3, datanodes))
 *
 * Data lives under BASE_DIR/data (kept across restarts when --keep is given, else
 * formatted afresh). Once the NameNode is out of safe mode and every DataNode has
 * reported, the last line printed on stdout is the URL `hdfs://127.0.0.1:PORT`; the
 * process then stays up until killed (SIGTERM shuts the cluster down). Any failure
 * to start prints `MiniHdfs: failed: ...` on stderr and exits 1.
 */
import java.io.File;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public final class MiniHdfs {
  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: MiniHdfs BASE_DIR [--datanodes N] [--port P] "
          + "[--permissions on|off] [--replication R] [--keep]");
      System.exit(2);
    }
    File base = new File(args[0]).getAbsoluteFile();
    int datanodes = 1;
    int port = 0;
    boolean permissions = false;
    int replication = -1;
    boolean keep = false;
    for (int i = 1; i < args.length; i++) {
      switch (args[i]) {
        case "--datanodes": datanodes = Integer.parseInt(args[++i]); break;
        case "--port": port = Integer.parseInt(args[++i]); break;
        case "--permissions": permissions = "on".equals(args[++i]); break;
        case "--replication": replication = Integer.parseInt(args[++i]); break;
        case "--keep": keep = true; break;
        default:
          System.err.println("MiniHdfs: failed: unknown option " + args[i]);
          System.exit(2);
      }
    }
    if (datanodes < 1 || datanodes > 3) {
      System.err.println("MiniHdfs: failed: --datanodes must be 1..3, not " + datanodes);
      System.exit(2);
    }
    if (replication < 1) {
      replication = Math.min(3, datanodes);
    }
    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(base, "data").getPath());
    conf.setBoolean("dfs.permissions.enabled", permissions);
    conf.setInt("dfs.replication", replication);
    // Bind everything to loopback: tests never reach beyond 127.0.0.1.
    conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
    conf.set("dfs.datanode.hostname", "127.0.0.1");
    conf.set("dfs.namenode.http-address", "127.0.0.1:0");
    MiniDFSCluster cluster;
    try {
      cluster = new MiniDFSCluster.Builder(conf)
          .numDataNodes(datanodes)
          .nameNodePort(port)
          .format(!keep)
          .manageNameDfsDirs(true)
          .manageDataDfsDirs(true)
          .checkDataNodeHostConfig(true)
          .build();
      cluster.waitClusterUp();
      cluster.waitActive();
    } catch (Exception e) {
      System.err.println("MiniHdfs: failed: " + e);
      e.printStackTrace();
      System.exit(1);
      return;
    }
    // Shut down on SIGTERM/SIGINT before the JVM's shutdown begins: Hadoop's own
    // threads remove shutdown hooks while stopping, which fails once it has begun.
    final MiniDFSCluster running = cluster;
    sun.misc.SignalHandler stop = sig -> {
      try {
        running.shutdown();
      } finally {
        Runtime.getRuntime().halt(0);
      }
    };
    sun.misc.Signal.handle(new sun.misc.Signal("TERM"), stop);
    sun.misc.Signal.handle(new sun.misc.Signal("INT"), stop);
    System.out.println("hdfs://127.0.0.1:" + cluster.getNameNodePort());
    System.out.flush();
    Thread.currentThread().join();
  }
}
