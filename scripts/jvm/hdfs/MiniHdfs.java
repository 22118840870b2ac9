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
 *
 * Faults on demand (scripts/hdfs.sh restart-namenode ...): before the URL is printed,
 * BASE_DIR/control holds the port of a line protocol on 127.0.0.1 (loopback only, like
 * the cluster itself). A client sends one command line and reads one answer line,
 * "ok ..." or "error: ...", once the command is done; commands run one at a time:
 *   restart-namenode   stop the NameNode and start it again on the same port, with its
 *                      image and edits (open files and their leases survive); answers
 *                      once it is out of safe mode, so the DataNodes have reported
 *   stop-namenode      stop the NameNode (clients' calls fail or retry until started)
 *   start-namenode     start it again (as restart-namenode)
 *   stop-datanode N    stop DataNode N (0-based, in start order): its blocks become
 *                      unreadable; the NameNode counts it live until its heartbeats
 *                      expire, but a writer's pipeline to it fails at once
 *   start-datanode N   start a stopped DataNode N again (same ports, same storage) and
 *                      wait until the NameNode has it live
 *   status             "ok namenode up|down, datanodes 0:up 1:down ..."
 */
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.io.PrintWriter;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.hdfs.MiniDFSCluster.DataNodeProperties;
import org.apache.hadoop.hdfs.server.datanode.DataNode;

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
    // A stopped or restarted node is noticed in seconds, not minutes: DataNodes
    // heartbeat every second, and one silent for 2 * 5 s + 10 * 1 s is dead.
    conf.setInt("dfs.heartbeat.interval", 1);
    conf.setInt("dfs.namenode.heartbeat.recheck-interval", 5000);
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
    try {
      new Control(cluster, base).start();
    } catch (Exception e) {
      System.err.println("MiniHdfs: failed: no control port: " + e);
      cluster.shutdown();
      System.exit(1);
    }
    System.out.println("hdfs://127.0.0.1:" + cluster.getNameNodePort());
    System.out.flush();
    Thread.currentThread().join();
  }

  /** The fault commands (see the header), served on 127.0.0.1:PORT, PORT in BASE/control. */
  static final class Control {
    private static final long WAIT_MS = 120_000;
    private final MiniDFSCluster cluster;
    private final File base;
    private final int port;
    private final List<String> datanodes = new ArrayList<>(); // transfer address by index
    private final Map<Integer, DataNodeProperties> stopped = new HashMap<>();
    private boolean namenodeUp = true;

    Control(MiniDFSCluster cluster, File base) {
      this.cluster = cluster;
      this.base = base;
      this.port = cluster.getNameNodePort();
      for (DataNode dn : cluster.getDataNodes()) {
        datanodes.add(dn.getDatanodeId().getXferAddr());
      }
    }

    void start() throws Exception {
      ServerSocket server = new ServerSocket(0, 4, InetAddress.getByName("127.0.0.1"));
      File pending = new File(base, ".control.tmp");
      Files.write(pending.toPath(),
          (server.getLocalPort() + "\n").getBytes(StandardCharsets.UTF_8));
      Files.move(pending.toPath(), new File(base, "control").toPath(),
          StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
      Thread thread = new Thread(() -> serve(server), "minihdfs-control");
      thread.setDaemon(true);
      thread.start();
    }

    private void serve(ServerSocket server) {
      while (true) {
        try (Socket client = server.accept();
             BufferedReader in = new BufferedReader(
                 new InputStreamReader(client.getInputStream(), StandardCharsets.UTF_8));
             PrintWriter out = new PrintWriter(client.getOutputStream(), true,
                 StandardCharsets.UTF_8)) {
          String line = in.readLine();
          if (line == null) {
            continue;
          }
          long began = System.nanoTime();
          String answer;
          try {
            answer = "ok " + run(line.trim().split("\\s+"));
          } catch (Exception e) {
            answer = "error: " + e.getMessage();
          }
          System.out.printf("MiniHdfs: %s: %s (%.1f s)%n", line.trim(), answer,
              (System.nanoTime() - began) / 1e9);
          System.out.flush();
          out.println(answer);
        } catch (Exception e) {
          System.err.println("MiniHdfs: control connection failed: " + e);
        }
      }
    }

    private synchronized String run(String[] words) throws Exception {
      switch (words[0]) {
        case "start-namenode":
          if (namenodeUp) {
            return "namenode up already on hdfs://127.0.0.1:" + port;
          }
          // fall through: start it as a restart does
        case "restart-namenode":
          cluster.restartNameNode(0, true);
          namenodeUp = true;
          waitOutOfSafeMode();
          if (cluster.getNameNodePort() != port) {
            throw new IllegalStateException("the NameNode came back on port "
                + cluster.getNameNodePort() + ", not " + port);
          }
          return "namenode up on hdfs://127.0.0.1:" + port;
        case "stop-namenode":
          cluster.shutdownNameNode(0);
          namenodeUp = false;
          return "namenode stopped";
        case "stop-datanode": {
          int index = datanode(words);
          if (stopped.containsKey(index)) {
            throw new IllegalStateException("datanode " + index + " is stopped already");
          }
          DataNodeProperties properties = cluster.stopDataNode(datanodes.get(index));
          if (properties == null) {
            throw new IllegalStateException("datanode " + index + " not found");
          }
          stopped.put(index, properties);
          return "datanode " + index + " stopped";
        }
        case "start-datanode": {
          int index = datanode(words);
          DataNodeProperties properties = stopped.get(index);
          if (properties == null) {
            throw new IllegalStateException("datanode " + index + " is not stopped");
          }
          cluster.restartDataNode(properties, true);
          stopped.remove(index);
          if (namenodeUp) {
            cluster.waitActive();
          }
          return "datanode " + index + " up";
        }
        case "status": {
          StringBuilder status = new StringBuilder("namenode " + (namenodeUp ? "up" : "down")
              + ", datanodes");
          for (int i = 0; i < datanodes.size(); i++) {
            status.append(' ').append(i).append(stopped.containsKey(i) ? ":down" : ":up");
          }
          return status.toString();
        }
        default:
          throw new IllegalArgumentException("unknown command " + words[0] + " (known: "
              + "restart-namenode, stop-namenode, start-namenode, stop-datanode N, "
              + "start-datanode N, status)");
      }
    }

    private int datanode(String[] words) {
      int index;
      try {
        index = Integer.parseInt(words.length == 2 ? words[1] : "");
      } catch (NumberFormatException e) {
        throw new IllegalArgumentException(words[0] + " needs one DataNode index, 0.."
            + (datanodes.size() - 1));
      }
      if (index < 0 || index >= datanodes.size()) {
        throw new IllegalArgumentException("no datanode " + index + " (0.."
            + (datanodes.size() - 1) + ")");
      }
      return index;
    }

    private void waitOutOfSafeMode() throws InterruptedException {
      long deadline = System.currentTimeMillis() + WAIT_MS;
      while (cluster.getNamesystem().isInSafeMode()) {
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException("the NameNode is still in safe mode after "
              + WAIT_MS / 1000 + " s (are DataNodes stopped?)");
        }
        Thread.sleep(100);
      }
    }
  }
}
