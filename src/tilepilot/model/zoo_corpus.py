"""A small English corpus, written for tilepilot, that the zoo trains its byte-level BPE tokenizer on.

It is embedded (not downloaded) so that a zoo tokenizer is the same on every machine. It mixes plain
prose, dialogue, numbers, code, punctuation and a little non-ASCII text so that the learned merges
look like those of a real tokenizer: common words become single tokens, rare words split into pieces.
"""

CORPUS = """\
The small boat left the harbour just after dawn, when the water was still and grey. The fisherman
checked his nets twice, then once more, because his father had always told him that a careful man
loses fewer fish. Gulls followed the boat out past the lighthouse and then turned back toward the town.

In the morning the market opens at seven. Farmers bring apples, pears, potatoes, onions and cabbages
from the valley, and the baker sells bread that is still warm. People stand in line, talk about the
weather, and argue about the price of eggs. By noon the square is empty again and the pigeons return.

She opened the old book carefully. The pages were yellow and the ink had faded, but the words were
still clear: "Whoever finds this letter should know that the garden behind the house was planted by
my grandmother, and every tree in it has a name." She smiled, closed the book, and went outside.

A computer does exactly what it is told, which is both its strength and its weakness. If the program
is correct, the machine will run it a billion times without a single mistake. If the program is wrong,
the machine will repeat the same mistake just as faithfully. Good engineers therefore write tests.

The river rises in the mountains, where snow melts in the spring and runs down through the forest in
a thousand small streams. By the time it reaches the plain it is wide and slow, and boats carry wheat,
wood and coal to the cities on the coast. In summer children swim near the old stone bridge.

"Where are you going?" asked the teacher.
"To the library," said the student. "I need a book about the history of the railway."
"The library closes at five today," the teacher replied. "You should hurry."
"Thank you. I will be back before the lesson starts tomorrow morning."

The weather forecast for tomorrow: cloudy in the morning with light rain in the north, clearing in the
afternoon. Temperatures between 12 and 18 degrees. Wind from the west at 20 kilometres per hour, stronger
near the coast. The weekend will be warmer, with sunshine on Saturday and Sunday.

Every language has words for the things its speakers care about most. Sailors have many words for wind,
farmers for soil and rain, and programmers for the ways in which software can fail. Learning those
words is part of learning the work itself, because a name lets you notice a thing and talk about it.

In 1969 two astronauts walked on the Moon while a third waited in orbit. The landing craft carried a
computer with about 72 kilobytes of memory, far less than a modern telephone. The engineers who wrote
its software tested every routine by hand, and during the landing the computer raised alarms that the
crew had trained for. They landed safely with only a few seconds of fuel to spare.

def mean(values):
    total = 0.0
    for value in values:
        total += value
    return total / len(values)

for i in range(10):
    print(i, i * i, mean([i, i + 1, i + 2]))

if x > 0 and y > 0:
    result = x + y
else:
    result = None

The recipe is simple. Take two cups of flour, one cup of milk, two eggs and a pinch of salt. Mix the
flour and salt in a large bowl, make a well in the middle, and add the eggs and milk. Whisk until the
batter is smooth, then let it rest for thirty minutes. Heat a little butter in a pan and cook the
pancakes one at a time, turning each one when the edges are golden.

The train to the capital leaves from platform four at 9:15 and arrives at 11:40. Tickets cost 24 euros
for adults and 12 euros for children under fourteen. Passengers with bicycles should use the first
carriage. Please keep your luggage with you at all times and report anything unusual to the staff.

Mathematics is the art of giving the same name to different things. A matrix is a table of numbers,
but it is also a linear map, a system of equations, and a way to describe a rotation in space. When we
multiply two matrices we compose two maps, and the result tells us what happens when one follows the
other. The sum of the first n odd numbers is n squared: 1 + 3 + 5 + 7 = 16.

Once upon a time there was a fox who lived at the edge of a great forest. Every night he walked to the
farm on the hill, looked at the chickens behind the fence, and walked home again, because the farmer
had a large dog. One winter the dog grew old and slept by the fire, and the fox thought his chance had
come. But the chickens had learned to sleep on the roof of the barn, and the fox went home hungry.

The city council met on Tuesday evening to discuss the new bus routes. Several residents asked for a
stop near the hospital, and others complained about noise on the main road. The mayor promised a
decision before the end of the month. The meeting ended at ten, later than anyone had expected.

Good writing is clear writing. Say what you mean, use short words where they will do, and cut every
sentence that does not help the reader. Read your text aloud: if you stumble, so will your reader.
Then put it away for a day and read it again, because yesterday's sentences are easier to judge.

Water boils at 100 degrees Celsius at sea level, but at lower temperatures high in the mountains, where
the air pressure is lower. That is why pasta takes longer to cook in a mountain hut, and why climbers
carry pressure cookers. Ice, on the other hand, melts at zero degrees almost everywhere on Earth.

Dear Anna,
Thank you for your letter and for the photographs of the new house. The garden looks beautiful, and I
can see that the children are happy there. We are all well here. Your brother has started his new job
at the hospital and works long hours, but he says he enjoys it. I hope to visit you in the summer.
With love, Maria

The museum is open every day except Monday from ten in the morning until six in the evening. Entry is
free on the first Sunday of each month. The collection includes paintings, maps, tools, coins and
clothes from the seventeenth century to the present day, and a small room about the history of printing.

Scientists measure the age of old trees by counting their rings. Each year a tree grows a light ring
in spring and a dark ring in late summer, so a slice of the trunk is a calendar of its life. Wide rings
mean good years with plenty of rain; narrow rings mean drought, cold, or a fire in the forest nearby.

The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly
quick daft zebras jump! Sphinx of black quartz, judge my vow. These sentences use every letter of the
alphabet, which is why typists and printers have used them for more than a hundred years.

Questions and answers:
Q: How many days are there in a leap year?
A: There are 366 days in a leap year, one more than in an ordinary year.
Q: What is the capital of France?
A: Paris is the capital of France.
Q: Why is the sky blue?
A: Air scatters blue light more strongly than red light, so the sky looks blue during the day.

The engine would not start. He tried again, listened to the dry clicking sound, and sighed. The
nearest village was twelve kilometres away, the sun was going down, and his telephone had no signal.
He took the torch from the glove box, locked the car, and began to walk along the empty road.

Music, like language, is built from small parts. A few notes make a motif, a few motifs make a phrase,
and phrases answer each other like sentences in a conversation. A good melody sets up an expectation
and then either fulfils it or surprises us, and we remember the surprises best.

The library's rules are short: return books on time, keep your voice down, and do not eat near the
shelves. Members may borrow up to six books for three weeks, and renew them twice online or by phone.
Late returns cost twenty cents per book per day. Lost books must be replaced or paid for.

Café, naïve, résumé and über are words that English borrowed from other languages, and some writers
still keep their accents. The Greek letters alpha, beta and gamma (α, β, γ) appear in science, and
the symbols ±, ×, ÷ and ° appear in mathematics and in weather reports. Prices may be written as
€20, £15 or $30, and temperatures as 21 °C.

She had always wanted to see the northern lights, so in February she took the night train to the
far north. For three nights the sky was covered with clouds. On the fourth night the clouds opened,
and green light moved across the sky like a curtain in the wind. She stood in the snow for an hour
and forgot how cold she was.

Every system that stores data must decide what happens when something goes wrong halfway through a
write. The safe answer is to write the new data to a temporary file first and then rename it over the
old one, because a rename either happens completely or not at all. A reader then sees either the old
version or the new one, never a mixture of both.

The team had trained for months, and on the day of the race the weather was perfect. They started
well, lost ground on the long hill, and then caught up with the leaders in the last two kilometres.
At the finish line they were second by less than a second, and they were proud of every metre.

Numbers: one, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty, thirty,
forty, fifty, hundred, thousand, million. First, second, third, fourth, fifth. 0 1 2 3 4 5 6 7 8 9.
3.14159, 2.71828, 1.41421, 42, 1024, 65536, 2048, 4096, 8192, 100000, 2024-05-17, 12:30, 50%.

The doctor listened to his heart, looked at his throat, and asked him how long he had had the cough.
"About two weeks," he said. "It is worse at night." She wrote a prescription and told him to drink
plenty of water, rest for a few days, and come back if the fever returned.

Small habits shape a life more than big decisions do. Getting up at the same time each day, walking
after dinner, reading a few pages before sleep: none of these seems important on its own, but over
years they add up to health, knowledge, and a calm mind.

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def __len__(self):
        return len(self.items)

The old lighthouse keeper kept a log of every ship that passed. In forty years he wrote down more than
thirty thousand names, the direction each ship was sailing, and the state of the sea. When he retired,
the town printed his log as a book, and sailors still read it to learn the moods of the bay.

Bees visit flowers to collect nectar and pollen, and in doing so they carry pollen from one flower to
another. Without them many fruits and vegetables would not grow. A single hive may hold fifty thousand
bees in summer, and together they can visit millions of flowers in a day.

When you travel, carry less than you think you need. A small bag is easy to lift onto a train, fits
under a seat on a plane, and never gets lost at the airport. Most things you forget can be bought on
the way, and the things that matter most, a passport and a ticket, fit in a pocket.

The history of writing begins with counting. The first written signs recorded sheep, grain and jars of
oil, and only later did people use them for names, laws, letters and stories. Paper came much later,
and printing later still, but each step made it cheaper to keep words and share them widely.

It was raining when they reached the hotel. The receptionist gave them a key, apologised that the lift
was broken, and pointed to the stairs. Their room was on the fifth floor, small but clean, with a
window that looked over the roofs of the old town and the tower of the cathedral.

In a democracy, citizens choose their representatives in free elections, and those representatives
make laws on their behalf. Courts decide whether the laws have been followed, and a free press reports
on what the government does. Each part checks the others, so that no single part holds all the power.

The children built a snowman in the garden, with stones for eyes, a carrot for a nose, and an old red
scarf around its neck. By the afternoon the sun came out and the snowman began to lean to one side.
The next morning only the scarf, the carrot, and two stones were left on the wet grass.
"""
