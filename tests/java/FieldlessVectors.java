// Writes tests/vectors/fieldless/documents.tsv: method calls through Chronicle's MethodWriter on a
// WireType.FIELDLESS_BINARY wire, and positional values (ValueOut without field names) on BINARY, each
// document as one "name<TAB>hex" line. Regenerate with tests/java/regenerate_fieldless.sh.
package chronqvectors;

import net.openhft.chronicle.bytes.Bytes;
import net.openhft.chronicle.wire.SelfDescribingMarshallable;
import net.openhft.chronicle.wire.ValueOut;
import net.openhft.chronicle.wire.Wire;
import net.openhft.chronicle.wire.WireType;

import java.io.PrintStream;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;

public final class FieldlessVectors {
    public enum Side { BUY, SELL }

    public static final class Leg extends SelfDescribingMarshallable {
        String venue;
        long qty;
        Leg(String venue, long qty) { this.venue = venue; this.qty = qty; }
    }

    public static final class Trade extends SelfDescribingMarshallable {
        long ts;
        String symbol;
        double price;
        int qty;
        Side side;
        String trader;
        Trade(long ts, String symbol, double price, int qty, Side side, String trader) {
            this.ts = ts; this.symbol = symbol; this.price = price; this.qty = qty; this.side = side; this.trader = trader;
        }
    }

    public static final class Order extends SelfDescribingMarshallable {
        String id;
        Leg first;
        Leg second;
        boolean urgent;
        Order(String id, Leg first, Leg second, boolean urgent) {
            this.id = id; this.first = first; this.second = second; this.urgent = urgent;
        }
    }

    public interface Trading {
        void trade(Trade t);
        void order(Order o);
        void say(String s);
        void quote(String symbol, double bid, double ask);
        void ping(long n);
        void noArgs();
    }

    private static final List<String[]> OUT = new ArrayList<>();

    public static void main(String[] args) throws Exception {
        Path dir = Paths.get(args[0]);
        Files.createDirectories(dir);
        List<Bytes<?>> docs = new ArrayList<>();
        List<String> names = new ArrayList<>();

        // method calls, each on its own FIELDLESS_BINARY wire so its bytes can be printed alone
        String[] calls = {"trade", "order", "say", "quote", "ping", "noArgs", "trade2"};
        for (String call : calls) {
            Bytes<?> bytes = Bytes.allocateElasticOnHeap();
            Wire wire = WireType.FIELDLESS_BINARY.apply(bytes);
            Trading t = wire.methodWriter(Trading.class);
            switch (call) {
                case "trade": t.trade(new Trade(1700000000123L, "EURUSD", 1.0875, 5, Side.BUY, "bob")); break;
                case "trade2": t.trade(new Trade(-1, "\u00e9t\u00e9", 1e-300, -70000, Side.SELL, null)); break;
                case "order": t.order(new Order("o-1", new Leg("LSE", 100), new Leg("XETRA", 1L << 40), true)); break;
                case "say": t.say("hello, fieldless"); break;
                case "quote": t.quote("GBPUSD", 1.25, 1.2502); break;
                case "ping": t.ping(42); break;
                case "noArgs": t.noArgs(); break;
            }
            docs.add(bytes);
            names.add("call:" + call);
        }

        // positional values as Java's ValueOut writes them on BINARY (no field names)
        Bytes<?> rec = Bytes.allocateElasticOnHeap();
        Wire w = WireType.BINARY.apply(rec);
        ValueOut v = w.getValueOut();
        v.int32(1);
        v.int64(1L << 40);
        v.float64(2.5);
        v.text("x");
        v.bool(true);
        v.object(new BigDecimal("0.10"));
        v.object(new BigDecimal("-12345678901234567890.123456789"));
        v.object(new BigDecimal("1E+3"));
        docs.add(rec);
        names.add("record:values");

        // "name<TAB>hex" per document; a MethodWriter on a plain wire frames each call as a document, so its
        // 4-byte header is left out: what is kept is the body a queue excerpt holds
        try (PrintStream ps = new PrintStream(Files.newOutputStream(dir.resolve("documents.tsv")))) {
            ps.println("# written by tests/java/FieldlessVectors.java (Chronicle Wire 2.26ea11); regenerate: tests/java/regenerate_fieldless.sh");
            for (int i = 0; i < docs.size(); i++) {
                Bytes<?> d = docs.get(i);
                int from = names.get(i).startsWith("call:") ? 4 : 0;
                StringBuilder hex = new StringBuilder();
                for (long p = from; p < d.writePosition(); p++) hex.append(String.format("%02x", d.readUnsignedByte(p)));
                ps.println(names.get(i) + "\t" + hex);
            }
        }
    }
}
