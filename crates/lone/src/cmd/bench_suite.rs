//! The fixed chat prompts of `lone bench --suite`: real requests of growing length, from a
//! greeting to a ~1500-token multi-document task. Changing them changes the suite's numbers;
//! keep them stable so results stay comparable over time.

/// (name, user message) in the order the suite runs them.
pub fn prompts() -> Vec<(&'static str, String)> {
    vec![
        ("tiny", "Hi!".to_string()),
        (
            "short",
            "What is the capital of France, and what is it best known for?".to_string(),
        ),
        (
            "medium",
            format!("{PRINTING}\n\nSummarize the text above in three bullet points."),
        ),
        (
            "long",
            format!(
                "Here are two short texts.\n\nText 1:\n{PRINTING}\n\nText 2:\n{BREAD}\n\n\
                 For each text, name its main subject, list the key steps or events it describes \
                 in order, and then explain in one paragraph what the two have in common."
            ),
        ),
        (
            "stress",
            format!(
                "You are reviewing a collection of documents for a newsletter. Read all of them \
                 carefully.\n\nDocument A:\n{PRINTING}\n\nDocument B:\n{BREAD}\n\nDocument C:\n\
                 {INCIDENT}\n\nDocument D:\n{TIDES}\n\nDocument E:\n{GARDEN}\n\nDocument F:\n\
                 {TRAINS}\n\nWrite a title for each document, a two-sentence summary of each, and \
                 finally suggest which document should open the newsletter and why."
            ),
        ),
    ]
}

const PRINTING: &str =
    "Before the middle of the fifteenth century, books in Europe were copied by \
hand, usually by monks or professional scribes who could spend months on a single volume. Around \
1440, Johannes Gutenberg, a goldsmith from Mainz, combined several existing ideas into a practical \
system: movable metal type cast from a durable alloy of lead, tin and antimony, an oil-based ink \
that stuck to metal, and a screw press adapted from the ones used to make wine and paper. Each \
letter was cast in a hand mould from a matrix, so thousands of identical pieces could be made \
quickly. Compositors arranged the letters into lines and pages, inked them, and pressed sheets of \
damp paper against them. The famous Gutenberg Bible, finished around 1455, showed that printed \
books could be as beautiful as manuscripts. Within fifty years, presses were operating in more \
than two hundred cities, and millions of books had been printed. Prices fell, literacy rose, and \
ideas travelled faster than ever before, which helped drive the Reformation, the scientific \
revolution and the growth of newspapers.";

const BREAD: &str = "Making a simple loaf of bread takes only flour, water, salt and yeast, but the \
process rewards patience. First, mix five hundred grams of flour with about three hundred and fifty \
grams of lukewarm water and let it rest for half an hour; this pause, called autolyse, lets the \
flour absorb the water and the gluten begin to form. Next, add ten grams of salt and a few grams of \
yeast, then knead the dough for ten minutes until it is smooth and springs back when pressed. \
Cover the bowl and leave it somewhere warm. As the yeast feeds on sugars in the flour it releases \
carbon dioxide, and the stretchy gluten network traps the gas, so the dough slowly doubles in size \
over one to two hours. Gently press out the air, shape the dough into a tight ball or a log, and \
let it rise a second time. Meanwhile, heat the oven to about two hundred and thirty degrees \
Celsius, ideally with a heavy pot inside. Bake the loaf covered for twenty minutes so the steam \
keeps the crust soft while the bread expands, then uncover it and bake for another twenty minutes \
until the crust is deep brown and the loaf sounds hollow when tapped. Let it cool completely before \
slicing, because the inside is still cooking as the heat escapes.";

const INCIDENT: &str =
    "Incident report: on Tuesday at 09:42 UTC the checkout service began returning \
errors for roughly one in five requests. The on-call engineer was paged at 09:47 after the error \
rate crossed the alert threshold. Initial investigation showed that the database connection pool \
was exhausted: every connection was held by long-running queries from a new reporting feature \
deployed the previous evening. The feature ran an unindexed query over the orders table each time \
a manager opened the dashboard, and traffic to the dashboard rose sharply at the start of the \
working day. At 10:05 the team disabled the feature with a configuration flag, and the error rate \
returned to normal within three minutes as the queries finished. No orders were lost, but about \
two thousand customers saw an error page and some retried their purchases. Follow-up actions: add \
the missing index, move reporting queries to a read replica with its own connection pool, add a \
load test for the dashboard to the release checklist, and alert on pool saturation before it \
reaches one hundred percent rather than on the resulting errors.";

const TIDES: &str = "Tides are the regular rise and fall of the sea caused mainly by the gravity of \
the Moon and, to a lesser degree, the Sun. The Moon pulls hardest on the side of the Earth facing \
it and least on the far side, so the oceans bulge outward in two places: one toward the Moon and \
one away from it. As the Earth rotates through these bulges, most coasts experience two high tides \
and two low tides roughly every twenty-four hours and fifty minutes, the extra fifty minutes coming \
from the Moon's own motion along its orbit. When the Sun and Moon line up, at new and full moon, \
their pulls add together and produce spring tides with an especially large range. When they are \
at right angles, during the quarter moons, the pulls partly cancel and the range is smaller; these \
are neap tides. The shape of coastlines and the depth of the sea floor change the picture greatly: \
some enclosed seas barely have tides at all, while funnel-shaped bays such as the Bay of Fundy in \
Canada can see the water rise and fall by more than fifteen metres.";

const GARDEN: &str = "A small vegetable garden can feed a family for much of the summer if it is \
planned well. Choose the sunniest spot available, since most vegetables need at least six hours of \
direct sun a day. Improve the soil before planting by digging in a few centimetres of compost, \
which adds nutrients and helps sandy soils hold water and clay soils drain. Start with easy, \
productive crops: lettuce and radishes grow quickly from seed, bush beans need little care, and a \
couple of tomato and courgette plants will produce more than most households can eat. Plant tall \
crops on the north side so they do not shade the others, and leave paths wide enough to reach \
every bed without stepping on the soil. Water deeply once or twice a week rather than a little \
every day, so that roots grow down instead of staying near the surface. A layer of straw or \
shredded leaves keeps moisture in and weeds down. Finally, keep a simple notebook of what was sown \
where and when; next year it will help you rotate crops and avoid repeating mistakes.";

const TRAINS: &str = "The first public railway to carry passengers in steam-hauled trains opened \
between Stockton and Darlington in the north of England in 1825, and the Liverpool and Manchester \
Railway followed in 1830 with a fully timetabled service. Within two decades railways had spread \
across Britain, Europe and North America. They changed how people thought about time itself: \
before trains, each town kept its own local time based on the position of the sun, so noon in \
Bristol came about ten minutes later than noon in London. Timetables that crossed many towns \
became confusing and even dangerous, and railway companies adopted a single standard time along \
their lines. In 1883 the railways of the United States and Canada introduced time zones, and an \
international conference the following year chose Greenwich as the prime meridian. Railways also \
created new industries, opened distant markets to farmers, made seaside holidays possible for \
working families, and required enormous feats of engineering, including tunnels, viaducts and \
bridges that are still in use today.";

/// A ~330-token Python file for the copy and edit workloads of `--spec-workloads`.
pub const CODE: &str = r#"import json
import sys


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError("not enough " + name)
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())

    def to_json(self):
        return json.dumps(self.items, sort_keys=True)


def main(args):
    inv = Inventory()
    for arg in args:
        name, count = arg.split("=")
        inv.add(name, int(count))
    print(inv.to_json())
    print("total:", inv.total())


if __name__ == "__main__":
    main(sys.argv[1:])
"#;

/// The workloads of `lone bench --spec-workloads` (name, user message): text a model can copy
/// (copy, edit), half-copy (summarise) and text it cannot predict (prose). Keep them stable.
pub fn spec_workloads() -> Vec<(&'static str, String)> {
    vec![
        (
            "copy",
            format!(
                "Print the following Python file again, exactly as it is:\n\n```python\n{CODE}```"
            ),
        ),
        (
            "edit",
            format!(
                "Rewrite the following Python file with one change: rename the class Inventory \
                 to Stock. Output the whole file.\n\n```python\n{CODE}```"
            ),
        ),
        (
            "summarise",
            format!("{PRINTING}\n\nSummarize the text above in three bullet points."),
        ),
        (
            "prose",
            "Write a short story about a lighthouse keeper who finds a message in a bottle."
                .to_string(),
        ),
    ]
}
